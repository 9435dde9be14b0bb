"""What a compiled shader declares, read from its SPIR-V: the push-constant
block and the storage blocks, member by member (name, byte offset, type).

The host packs push constants and the step buffer from this reflection, and
the build checks it against vkspec/shaders/push.py, so a block edited on one
side only fails the build instead of shifting every later field.

Standard library only: the build hook loads this file before vkspec's
dependencies are installed. SPIR-V's binary layout: a 5-word header, then
instructions whose first word is (word count << 16) | opcode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x07230203
OP_NAME, OP_MEMBER_NAME = 5, 6
OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR = 21, 22, 23
OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER = 28, 29, 30, 32
OP_CONSTANT, OP_VARIABLE = 43, 59
OP_DECORATE, OP_MEMBER_DECORATE = 71, 72
DEC_BINDING, DEC_OFFSET = 33, 35
STORAGE_UNIFORM, STORAGE_PUSH_CONSTANT, STORAGE_BUFFER = 2, 9, 12


class SpirvError(ValueError):
    pass


@dataclass(frozen=True)
class Member:
    name: str
    offset: int           # bytes from the block's start
    type: str             # "uint" | "int" | "float" | "vec4" ... | "uint[8]" | "float[]"


@dataclass(frozen=True)
class Block:
    name: str             # the block's type name (``Push``, ``Step``, ``W``)
    members: tuple[Member, ...]
    binding: int | None   # None for the push-constant block


@dataclass(frozen=True)
class Reflection:
    push: Block | None
    buffers: tuple[Block, ...]   # storage blocks by binding

    def buffer(self, name: str) -> Block | None:
        return next((b for b in self.buffers if b.name == name), None)


def _string(words: list[int]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode()


def reflect(spirv: bytes) -> Reflection:
    if len(spirv) < 20 or len(spirv) % 4:
        raise SpirvError("not a SPIR-V module (size)")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if words[0] != MAGIC:
        raise SpirvError("not a SPIR-V module (magic)")
    names, member_names, offsets, bindings = {}, {}, {}, {}
    types: dict[int, tuple] = {}
    constants: dict[int, int] = {}
    variables = []                       # (pointer type, id, storage class)
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise SpirvError("malformed instruction")
        a = words[i + 1:i + count]
        if op == OP_NAME:
            names[a[0]] = _string(list(a[1:]))
        elif op == OP_MEMBER_NAME:
            member_names[(a[0], a[1])] = _string(list(a[2:]))
        elif op == OP_MEMBER_DECORATE and a[2] == DEC_OFFSET:
            offsets[(a[0], a[1])] = a[3]
        elif op == OP_DECORATE and a[1] == DEC_BINDING:
            bindings[a[0]] = a[2]
        elif op == OP_TYPE_INT:
            types[a[0]] = ("int" if a[2] else "uint",) if a[1] == 32 else (f"int{a[1]}",)
        elif op == OP_TYPE_FLOAT:
            types[a[0]] = ("float",) if a[1] == 32 else (f"float{a[1]}",)
        elif op == OP_TYPE_VECTOR:
            types[a[0]] = ("vector", a[1], a[2])
        elif op == OP_TYPE_ARRAY:
            types[a[0]] = ("array", a[1], a[2])
        elif op == OP_TYPE_RUNTIME_ARRAY:
            types[a[0]] = ("runtime", a[1])
        elif op == OP_TYPE_STRUCT:
            types[a[0]] = ("struct", tuple(a[1:]))
        elif op == OP_TYPE_POINTER:
            types[a[0]] = ("pointer", a[1], a[2])
        elif op == OP_CONSTANT:
            constants[a[1]] = a[2]
        elif op == OP_VARIABLE:
            variables.append((a[0], a[1], a[2]))
        i += count

    def type_name(t: int) -> str:
        kind = types[t]
        if kind[0] == "vector":
            base = type_name(kind[1])
            return {"float": "vec", "uint": "uvec", "int": "ivec"}.get(base, base + "vec") + str(kind[2])
        if kind[0] == "array":
            return f"{type_name(kind[1])}[{constants[kind[2]]}]"
        if kind[0] == "runtime":
            return f"{type_name(kind[1])}[]"
        if kind[0] == "struct":
            return names.get(t, "struct")
        return kind[0]

    push, buffers = None, []
    for ptr, var, storage in variables:
        if storage not in (STORAGE_PUSH_CONSTANT, STORAGE_UNIFORM, STORAGE_BUFFER):
            continue
        _, _, struct_id = types[ptr]
        kind = types[struct_id]
        if kind[0] != "struct":
            continue
        members = tuple(Member(member_names.get((struct_id, m), f"m{m}"), offsets[(struct_id, m)],
                               type_name(t)) for m, t in enumerate(kind[1]))
        block = Block(names.get(struct_id, ""), members,
                      None if storage == STORAGE_PUSH_CONSTANT else bindings.get(var))
        if storage == STORAGE_PUSH_CONSTANT:
            push = block
        else:
            buffers.append(block)
    return Reflection(push, tuple(sorted(buffers, key=lambda b: b.binding)))
