"""Train vkspec's tiny Qwen3-Next-style hybrid and its MTP head (development
only: torch and transformers are never needed to run vkspec).

The corpus is the Python standard library's own sources, available offline on
every machine: ``--corpus tree`` (the committed model) takes every ``.py`` under
``Lib/`` but site-packages and test suites, ``--corpus top`` only ``Lib/*.py``
(it overfits: ~2.8 epochs in 18 minutes); files are sorted by path and every
10th one is held out. A byte-level BPE tokenizer is
trained on the training files with ``tokenizers``. The trunk is transformers'
``Qwen3NextForCausalLM`` (``--layers`` in groups of 3 Gated DeltaNet layers + 1
gated attention layer, 8 routed experts top-2 plus a shared expert); the MTP head is written here
from transformers' own parts, as vkspec computes it:
``norm(layer(fc(cat[norm_emb(embed(t+1)), norm_hidden(h_t)])))`` -> lm_head,
where h_t is the trunk's last layer output before its final norm, trained to
predict token t+2.

The committed model took five runs (the model card has the numbers): 4
layers from scratch, then grown to 8 (``--init`` with more ``--layers``
appends layers whose output projections start at zero, so the deeper trunk
starts out computing exactly what the shallower one did), then continued;
then two runs that train only the head (``--distill-head``: the trunk is
frozen and saved bit for bit as it was, and the head learns the trunk's own
next-token distribution, which is what a greedy verify accepts), the second
with half of each batch from the trunk's own greedy continuations of
training windows (``--greedy-texts``), the text a verify actually checks:

    .venv/bin/python models/train_tiny_hybrid.py --out /tmp/stage1 --corpus tree --minutes 20
    .venv/bin/python models/train_tiny_hybrid.py --out /tmp/stage2 --corpus tree --init /tmp/stage1 \
        --layers 8 --minutes 22 --lr 6e-4
    .venv/bin/python models/train_tiny_hybrid.py --out /tmp/stage3 --corpus tree --init /tmp/stage2 \
        --layers 8 --minutes 25 --lr 3e-4 --mtp-weight 1.0
    .venv/bin/python models/train_tiny_hybrid.py --out /tmp/stage4 --corpus tree --init /tmp/stage3 \
        --layers 8 --minutes 30 --lr 5e-4 --distill-head
    .venv/bin/python models/train_tiny_hybrid.py --out models/tiny-hybrid --corpus tree --init /tmp/stage4 \
        --layers 8 --minutes 25 --lr 5e-4 --distill-head --greedy-texts 800

Deterministic for a given seed, thread count and torch build.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import json
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next.modeling_qwen3_next import (Qwen3NextDecoderLayer, Qwen3NextRMSNorm,
                                                                Qwen3NextRotaryEmbedding)

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def corpus(kind: str = "top"):
    """(train texts, held-out texts, held-out names relative to the stdlib).
    top: Lib/*.py; tree: every .py under Lib but site-packages and test suites."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    if kind == "tree":
        files = sorted(str(f.relative_to(lib)) for f in lib.rglob("*.py")
                       if not {"site-packages", "test", "tests"} & set(f.relative_to(lib).parts[:-1]))
    else:
        files = sorted(Path(f).name for f in glob.glob(str(lib / "*.py")))
    train = [f for i, f in enumerate(files) if i % 10]
    held = [f for i, f in enumerate(files) if i % 10 == 0]
    read = lambda fs: [(lib / f).read_text(encoding="utf-8", errors="replace") for f in fs]  # noqa: E731
    return read(train), read(held), held


def train_tokenizer(texts, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


class MtpHead(nn.Module):
    def __init__(self, cfg: Qwen3NextConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(h, eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(h, eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        one = copy.deepcopy(cfg)
        one.layer_types = ["full_attention"]
        one.num_hidden_layers = 1
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(one, 0)])
        self.norm = Qwen3NextRMSNorm(h, eps)
        self.rotary = Qwen3NextRotaryEmbedding(one)

    def forward(self, hidden, emb_next, positions):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], -1))
        t = x.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        out = self.layers[0](x, position_embeddings=self.rotary(x, positions), attention_mask=mask,
                             position_ids=positions)
        return self.norm(out[0] if isinstance(out, tuple) else out)


def batches(ids: np.ndarray, batch: int, seq: int, rng):
    while True:
        starts = rng.integers(0, len(ids) - seq - 1, batch)
        yield torch.from_numpy(np.stack([ids[s:s + seq] for s in starts]).astype(np.int64))


def greedy_texts(model_dir, ids: np.ndarray, count: int, prompt: int, gen: int, rng) -> np.ndarray:
    """(count, prompt + gen): windows of the training tokens continued by the
    trunk's own greedy decoding (vkspec's CPU path): the text a greedy verify
    checks drafts against."""
    from vkspec.speculative import generate
    from vkspec.loader import load_model
    m = load_model(model_dir, mtp=False)
    out = []
    for s in rng.integers(0, len(ids) - prompt, count):
        p = [int(t) for t in ids[s:s + prompt]]
        out.append(p + generate(m, p, gen).tokens[:gen])
    return np.array(out, np.int32)


def losses(model, head, x, distill=False):
    """(trunk CE, head loss, head top-1 on the data, head agreement with the
    trunk's own greedy pick). The head's row j reads h_j and token j+1 and
    predicts token j+2, which the trunk predicts at position j+1. With
    ``distill`` the trunk is frozen and the head learns the trunk's own
    distribution there (soft cross-entropy): a greedy verify accepts a draft
    when it equals the trunk's pick, not the corpus's next token."""
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad() if distill else contextlib.nullcontext():
        out = model(input_ids=x)
    hook.remove()
    logits, h = out.logits, captured["h"]
    ce = nn.functional.cross_entropy
    main = ce(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    t = x.shape[1]
    pos = torch.arange(1, t - 1)[None].expand(x.shape[0], -1)
    hm = head(h[:, :t - 2], model.model.embed_tokens(x[:, 1:t - 1]), pos)
    mlog = model.lm_head(hm)
    teacher = logits[:, 1:t - 1].detach()
    if distill:
        mtp = -(teacher.softmax(-1) * mlog.log_softmax(-1)).sum(-1).mean()
    else:
        mtp = ce(mlog.reshape(-1, mlog.shape[-1]), x[:, 2:].reshape(-1))
    acc = (mlog.argmax(-1) == x[:, 2:]).float().mean()
    agree = (mlog.argmax(-1) == teacher.argmax(-1)).float().mean()
    return main, mtp, acc, agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/tiny-hybrid")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)   # 3e-3 made the MTP branch diverge
    ap.add_argument("--corpus", choices=["top", "tree"], default="top",
                    help="top: Lib/*.py; tree: every .py under Lib but site-packages and test suites")
    ap.add_argument("--init", default=None,
                    help="continue from a checkpoint this script wrote (same corpus and tokenizer)")
    ap.add_argument("--mtp-weight", type=float, default=0.5, help="loss = next-token CE + this x MTP CE")
    ap.add_argument("--layers", type=int, default=4,
                    help="trunk layers, a multiple of 4 (3 DeltaNet + 1 attention each); with --init "
                         "from fewer, the new layers are appended with zero output projections")
    ap.add_argument("--distill-head", action="store_true",
                    help="with --init: freeze the trunk (its weights are saved unchanged) and train only "
                         "the MTP head, on the trunk's own next-token distribution")
    ap.add_argument("--greedy-texts", type=int, default=0,
                    help="with --distill-head: half of each batch from this many training windows (32 "
                         "tokens) continued by the trunk's greedy decoding (96 tokens)")
    a = ap.parse_args()
    if a.distill_head and not a.init:
        ap.error("--distill-head needs --init")
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held, held_names = corpus(a.corpus)
    tok = Tokenizer.from_file(str(Path(a.init) / "tokenizer.json")) if a.init else train_tokenizer(train, a.vocab)
    eot = tok.token_to_id("<|endoftext|>")
    enc = lambda texts: np.array([i for t in texts for i in tok.encode(t).ids + [eot]], np.int32)  # noqa: E731
    tr, ho = enc(train), enc(held)
    cfg = Qwen3NextConfig(
        vocab_size=a.vocab, hidden_size=192, intermediate_size=512, num_hidden_layers=a.layers,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (a.layers // 4),
        num_attention_heads=4, num_key_value_heads=2, head_dim=48, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=48, linear_value_head_dim=48,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=256, norm_topk_prob=True, rms_norm_eps=1e-6,
        max_position_embeddings=1024, partial_rotary_factor=0.25, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        eos_token_id=eot, bos_token_id=eot)
    model = Qwen3NextForCausalLM(cfg)
    head = MtpHead(cfg)
    # the head is built from bare modules: transformers initialises only a
    # PreTrainedModel's weights (its experts start as torch.empty), so give
    # every matrix the trunk's normal(0, initializer_range) init here
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, cfg.initializer_range)
    if a.init:
        from safetensors.torch import load_file
        sd = {k: v.float() for k, v in load_file(str(Path(a.init) / "model.safetensors")).items()}
        missing, unexpected = model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("mtp.")},
                                                    strict=False)
        grown = sorted({int(k.split(".")[2]) for k in missing})
        assert not unexpected and all(k.startswith("model.layers.") for k in missing), (missing, unexpected)
        # a grown layer starts as the identity on the residual stream: every
        # path into it ends in one of these projections, so the deeper trunk
        # computes what the checkpoint computed (the head's input included)
        # and training only has to improve on it
        with torch.no_grad():
            for i in grown:
                for name, p in model.model.layers[i].named_parameters():
                    if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight", "experts.down_proj")):
                        p.zero_()
        print(f"grown layers {grown}: zero output projections", flush=True)
        head.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("mtp.")}, strict=False)
    params = list(model.parameters()) + list(head.parameters())
    n_params = sum(p.numel() for p in params)
    if a.distill_head:
        for p in model.parameters():
            p.requires_grad_(False)
        params = list(head.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.05)
    data = batches(tr, a.batch, a.seq, rng)
    if a.greedy_texts:
        t_gen = time.time()
        greedy = greedy_texts(a.init, tr, a.greedy_texts, 32, a.seq - 32, rng)
        print(f"{len(greedy)} greedy texts in {time.time() - t_gen:.0f} s", flush=True)
        real = batches(tr, a.batch - a.batch // 2, a.seq, rng)
        data = (torch.cat([torch.from_numpy(greedy[rng.integers(0, len(greedy), a.batch // 2)]).long(), next(real)])
                for _ in iter(int, 1))
    t0, step, log, skipped = time.time(), 0, [], 0
    budget = a.minutes * 60
    est_steps = None
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        main_l, mtp_l, acc, agree = losses(model, head, next(data), a.distill_head)
        loss = mtp_l if a.distill_head else main_l + a.mtp_weight * mtp_l
        opt.zero_grad()
        if torch.isfinite(loss):
            loss.backward()
            # the reference (torch) delta-rule kernels overflow now and then: a
            # non-finite gradient skips the update instead of poisoning the weights
            if torch.isfinite(torch.nn.utils.clip_grad_norm_(params, 1.0)):
                opt.step()
            else:
                skipped += 1
        else:
            skipped += 1
        step += 1
        if step % 20 == 0 or step <= 3:
            log.append((step, time.time() - t0, main_l.item(), mtp_l.item(), acc.item(), agree.item()))
            print(f"step {step} {time.time() - t0:.0f}s loss {main_l.item():.3f} mtp {mtp_l.item():.3f} "
                  f"mtp acc {acc.item():.3f} agree {agree.item():.3f} lr {lr:.2e} skipped {skipped}", flush=True)
    train_s = time.time() - t0
    model.eval()
    head.eval()
    with torch.no_grad():
        hrng = np.random.default_rng(1)
        ev = [losses(model, head, next(batches(ho, 16, a.seq, hrng))) for _ in range(8)]
    held_main = float(np.mean([e[0].item() for e in ev]))
    held_mtp = float(np.mean([e[1].item() for e in ev]))
    held_acc = float(np.mean([e[2].item() for e in ev]))
    held_agree = float(np.mean([e[3].item() for e in ev]))
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    sd.update({f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()
               if not k.startswith("rotary")})
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    d = cfg.to_dict()
    d.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_nextn_predict_layers=1,
             dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                           "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    (out / "heldout_files.json").write_text(json.dumps(held_names) + "\n")
    prev = json.loads((Path(a.init) / "training.json").read_text()) if a.init else None
    stats = dict(params=n_params, steps=step, skipped_steps=skipped, continued_from=prev and
                 {k: prev[k] for k in ("steps", "train_seconds", "tokens_seen", "heldout_loss")}, train_seconds=round(train_s), tokens_seen=step * a.batch * a.seq,
                 train_tokens=int(tr.size), heldout_tokens=int(ho.size), final_train_loss=log[-1][2] if log else None,
                 heldout_loss=held_main, heldout_mtp_loss=held_mtp, heldout_mtp_top1=held_acc,
                 heldout_mtp_agree=held_agree, distill_head=a.distill_head, greedy_texts=a.greedy_texts,
                 torch=torch.__version__, threads=a.threads, lr=a.lr, mtp_weight=a.mtp_weight, layers=a.layers, seed=a.seed, corpus=a.corpus, log=log)
    (out / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps({k: v for k, v in stats.items() if k != "log"}))


if __name__ == "__main__":
    main()
