"""The kernel's configuration: one frozen object, given per call (``config=``) or read from the environment
once, at the first call that gives none.

The forward and its backward run under the same Config: autograd keeps the plan made at the forward, and
inside torch.compile the Config travels into both custom operators as a string (``str(config)``, or ""
for the environment's, read when the operators run), so a compiled run does what an eager one does.  Every field is also an environment variable, ``JFA_`` and the
field's name in capitals (``JFA_GLUON=0``); ``Config.from_env`` reads them, and a value it cannot take is a
ValueError naming the variable.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Mapping, Optional

TL_TILE_HEAD_DIMS = (16, 32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Config:
    # Run the Gluon kernels where they can (sm_90, bf16 / fp16, head dims the kernel serves, layouts TMA
    # can describe); False: the tl kernels everywhere (a GPU check of the tl path at the Gluon shapes).
    gluon: bool = True
    # Fewest keys a sequence needs for its forward to go to the Gluon forward; the rest go to the tl
    # forward, in a second launch writing other rows.  The Gluon forward holds one CTA per SM and streams
    # 128-key blocks, so short key ranges waste it; 0 sends every sequence to it (its tests).
    gluon_split_keys: int = 512
    # At most this many programs for each Gluon kernel; 0: one per SM.  Tests use a few, so that every
    # program takes many items (rings, double buffers and the item hand-off running on across items).
    gluon_programs: int = 0
    # The tl kernels' tiles: 0 picks them by device, dtype and head dim; 16, 32, 64 or 128 takes the GPU
    # tiles of that head dim on any device, so the interpreter can run the GPU's tile shapes.
    tl_tiles: int = 0
    # Read the offsets on the host and check them (a ValueError naming the field for offsets that do not
    # start at 0, decrease, do not end at the row count, or exceed a max_seqlen bound).  The copy waits for
    # the GPU, so a call makes it only where this is on or the offsets are on the CPU already; a JaggedPlan
    # always checks, once.  Unchecked malformed offsets give wrong answers, never accesses outside the call's
    # tensors (the kernels read them clamped).
    check_offsets: bool = False
    # Keep a plain call's tile lists for later calls with the same offsets tensors, unwritten since (their
    # version counters), on the same stream, outside CUDA graph capture (reuse.py): those calls launch only
    # the attention kernels.  Off for offsets written in place outside PyTorch (a custom kernel, another
    # framework), which the version counter cannot see.
    reuse_lists: bool = True
    # Up to this many sequences the builder that sorts them also writes the forward lists' items (one launch
    # instead of two; schedule.py); 0: always two.  Whether one program writing every item costs more GPU
    # time than the second launch costs host time is still to be measured in one process (PERF.md).
    builder_items_seqs: int = 512
    # Under causal masking the tile lists take a sequence's heads in groups whose streamed rows (K and V for
    # query tiles, Q and dO for key tiles) fit this many bytes, tile by tile across a group, heaviest first,
    # so a launch ends on light tiles while L2 still holds what the tiles in flight read (schedule.py); 0:
    # head by head.  8 MiB (four heads of S4b): its backward 1.4% faster, its forward level; 32 MiB (FA3's
    # figure) made the forward 2% slower (perf/LOG.md v37).
    head_group_bytes: int = 8 << 20

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            want = bool if field.type in ("bool", bool) else int
            if type(value) is not want:
                raise ValueError(f"Config.{field.name} must be {want.__name__}, got {value!r}")
        if self.gluon_split_keys < 0:
            raise ValueError(f"Config.gluon_split_keys must be >= 0, got {self.gluon_split_keys}")
        if self.head_group_bytes < 0:
            raise ValueError(f"Config.head_group_bytes must be >= 0, got {self.head_group_bytes}")
        if self.builder_items_seqs < 0:
            raise ValueError(f"Config.builder_items_seqs must be >= 0, got {self.builder_items_seqs}")
        if self.gluon_programs < 0:
            raise ValueError(f"Config.gluon_programs must be >= 0, got {self.gluon_programs}")
        if self.tl_tiles not in (0,) + TL_TILE_HEAD_DIMS:
            raise ValueError(f"Config.tl_tiles must be 0 or one of {TL_TILE_HEAD_DIMS}, got {self.tl_tiles}")

    def __str__(self):
        return ",".join(f"{f.name}={int(getattr(self, f.name))}" for f in dataclasses.fields(self))

    @classmethod
    def from_string(cls, text: str) -> "Config":
        """The Config ``str(config)`` wrote (fields left out keep their defaults)."""
        values = {}
        for part in filter(None, text.split(",")):
            name, _, value = part.partition("=")
            values[name] = _parse(f"Config field {name!r}", name, value)
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Config":
        """The Config the ``JFA_<FIELD>`` environment variables give (the defaults where unset)."""
        environ = os.environ if environ is None else environ
        values = {}
        for field in dataclasses.fields(cls):
            variable = "JFA_" + field.name.upper()
            if variable in environ:
                values[field.name] = _parse(variable, field.name, environ[variable])
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{exc} (from the JFA_* environment variables)") from None

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


def _parse(where: str, name: str, text: str):
    fields = {f.name: f for f in dataclasses.fields(Config)}
    if name not in fields:
        raise ValueError(f"{where}: no such field (fields: {', '.join(fields)})")
    if fields[name].type in ("bool", bool):
        if text not in ("0", "1"):
            raise ValueError(f"{where} must be 0 or 1, got {text!r}")
        return text == "1"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{where} must be an integer, got {text!r}") from None


@functools.lru_cache(maxsize=1)
def default() -> Config:
    """The environment's Config, read once."""
    return Config.from_env()
