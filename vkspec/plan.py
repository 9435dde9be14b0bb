"""`vkspec plan MODEL`: the memory plan, from the allocation code the dense
chain runs (VulkanModel.planned runs it without a device), so the two cannot
drift apart.

Figures (bytes):
* file: the checkpoint's bytes, memory-mapped; the CPU backend computes from
  them where they are (pages the OS loads on demand), nothing widened;
* dense weights: everything the trunk reads except routed experts, on the
  device in the file's own formats;
* routed experts: all of them, and the part the tier keeps on the device;
* KV cache at the context length; the MTP head (its weights and KV cache);
* recurrent state: the two regions every DeltaNet layer has, and the copy
  slots (one slot = every DeltaNet layer's conv ring and state);
* staging: the one host-visible buffer every upload goes through;
* working buffers (activations, routing, step buffer, logits per row count);
* host RAM beyond the mapped file: what the host makes of its own (weights
  quantised at load with --dtype; vectors read as float32) and, with the
  Vulkan backend, what it keeps after the upload (the tier's CPU fallback
  reads the experts the device does not hold from the mapped file).
"""

from __future__ import annotations

from .backends.vulkan.model import VulkanModel
from .loader import Loader, has_mtp, open_checkpoint, with_mtp_file
from .weights import MoeW, qweights, set_activations

MiB = float(1 << 20)


def plan(model_dir, fmt: str = "f32", ctx: int | None = None, tier=None, snapshots: int = 7,
         drafts: int = 7, activations: str = "q8", mtp_file=None) -> dict:
    cfg, ckpt = open_checkpoint(model_dir, fmt)
    ckpt = with_mtp_file(model_dir, ckpt, None, mtp_file)
    mtp = has_mtp(ckpt)
    w = Loader(cfg, ckpt, fmt).load(mtp)
    q8_matrices = set_activations(w, activations)
    slots = min(snapshots, drafts)
    p = VulkanModel.planned(cfg, w, ctx, tier, slots=slots)
    n_trunk = len(w.layers)

    def layer_of(name):
        part = name.split(":", 1)[1]
        return int(part[5:].split(".")[0]) if part.startswith("layer") else None

    fig = dict(dense_weights=0, routed_experts_on_device=0, kv_cache=0, mtp_head=0,
               recurrent_state=0, staging=0, working_buffers=0)
    for name, b in p.items:
        kind, li = name.split(":")[0], layer_of(name)
        is_mtp = (li is not None and li >= n_trunk) or name.startswith("weights:mtp.")
        routed = kind == "experts" or (kind == "weights" and ".gate_up" in name or ".down" in name) \
            and li is not None and li < n_trunk and isinstance(w.layers[li].ffn, MoeW) and ".sh_" not in name
        if is_mtp:
            fig["mtp_head"] += b
        elif routed:
            fig["routed_experts_on_device"] += b
        elif kind in ("weights", "rope"):
            fig["dense_weights"] += b
        elif kind == "kv":
            fig["kv_cache"] += b
        elif kind == "state":
            fig["recurrent_state"] += b
        elif kind == "staging":
            fig["staging"] += b
        else:
            fig["working_buffers"] += b
    c = cfg
    cd = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    n_delta = sum(k == "linear_attention" for k in c.layer_types)
    per_slot = n_delta * ((c.linear_conv_kernel_dim - 1) * cd
                          + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim) * 4
    experts_all = sum(int(e.gate.nbytes() + e.up.nbytes() + e.down.nbytes())
                      for lw in w.layers if isinstance(lw.ffn, MoeW) for e in lw.ffn.experts)
    made_here = sum(q.nbytes() for q in qweights(w)) if fmt != "f32" else 0
    out = dict(model=str(model_dir), dtype=fmt, activations=activations, q8_matrices=q8_matrices,
               context=cfg.context(ctx), mtp=mtp,
               snapshots=snapshots, drafts=drafts, copy_slots=slots,
               copy_slot_bytes=per_slot, copy_slots_bytes=per_slot * slots,
               routed_experts=experts_all, file=ckpt.file_bytes(),
               tier_budget=None if tier is None else int(tier.budget_gb * (1 << 30)),
               device_total=p.total, host_ram_cpu=made_here,
               host_ram=(experts_all if tier is not None and fmt != "f32" else 0), **fig)
    return out


def table(d: dict) -> str:
    rows = [("checkpoint file (memory-mapped)", d["file"]),
            ("dense weights", d["dense_weights"]),
            ("routed experts (all)", d["routed_experts"]),
            ("routed experts on the device", d["routed_experts_on_device"]),
            (f"KV cache at {d['context']} tokens", d["kv_cache"]),
            ("MTP head (weights + KV)", d["mtp_head"]),
            ("recurrent state (2 regions)", d["recurrent_state"] - d["copy_slots_bytes"]),
            (f"recurrent copy slots ({d['copy_slots']} x {d['copy_slot_bytes'] / MiB:.3f} MiB)",
             d["copy_slots_bytes"]),
            ("upload staging", d["staging"]),
            ("working buffers", d["working_buffers"]),
            ("device total", d["device_total"]),
            ("tier budget", d["tier_budget"]),
            ("host RAM beyond the file, CPU backend", d["host_ram_cpu"]),
            ("host RAM beyond the file, Vulkan backend", d["host_ram"])]
    w = max(len(r[0]) for r in rows)
    head = f"activations: {d['activations']} ({d['q8_matrices']} matrices in q8)\n"
    return head + "\n".join(f"{name:<{w}}  " + ("-" if b is None else f"{b / MiB:10.3f} MiB") for name, b in rows)
