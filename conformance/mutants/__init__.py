"""Mutant backends: correct attention with exactly one documented bug injected each.

``jfa-conformance selftest`` runs the spec against every mutant and fails if one survives: a spec that
passes a broken kernel is itself broken. Each mutant renders, on the CPU, a bug class that a real
jagged-attention kernel has had; its ``catalog_id`` names the class in :mod:`conformance.bugs` (rendered
into ``conformance/BUGS.md``), which cites where the bug was reported. Each mutant declares the same
capabilities as the ``reference`` backend it imitates, so the spec draws exactly the problems it would
draw for a correct backend; the bug, not a narrower declaration, is what must be caught.

The correct computation (:class:`Unmutated`, the control) is per-sequence attention in float64 on CPU,
written as small overridable steps; each mutant overrides one step. Use any of them with
``--backend conformance.mutants:<ClassName>``. The control is in ``base.py``; the mutants are
grouped by what they break: ``forward.py``, ``backward.py`` and ``inputs.py`` (what the caller chooses:
offset types and strides, strided tensors, values far from 0).

:data:`MUTANTS` are the ones the ``ci`` profile must catch. :data:`PENDING` render classes the spec's
drawing cannot yet reach (the catalog names the missing axis); each is checked on a problem that
triggers it (tests/test_bugs_catalog.py), and moves to :data:`MUTANTS` once the drawing reaches it.
"""
from __future__ import annotations

from .base import Unmutated
from .forward import (  # noqa: F401  (re-exported: --backend conformance.mutants:<ClassName>)
    ZeroLengthCompacted,
    KeyPastEnd,
    KeyOffsetsFromQuery,
    CrossSequenceLeak,
    MaxSeqlenOffByOne,
    KeyExtentFromMaxSeqlen,
    KeyTailBlockSkipped,
    KeyTailScoredZero,
    DuplicatedExtendKeys,
    ValueTilePastEnd,
    CausalTopLeft,
    CausalDiagonalFromMaxSeqlen,
    CausalShiftFromFirstSequence,
    GqaPackedRowCausal,
    NanForMaskedRows,
    FiniteMaskSentinel,
    EmptyStateMergeNan,
    LseFromLastSplit,
    GqaHeadModulo,
    HeadDimTruncated16,
    HeadDimFixed64,
    ScaleFromValueDim,
    Float32AsBfloat16,
    UnwrittenTail,
    OutHeadMajorLayout,
    LseBase2,
    LsePaddedLayout,
    LseTokenMajor,
    LseEmptyKvPaddedOffset,
    LseGqaDecodeFirstHeadOnly,
    GqaDecodeFastPathOneQueryEach,
)
from .backward import (  # noqa: F401  (re-exported: --backend conformance.mutants:<ClassName>)
    BroadcastQDqFirstSequence,
    GqaDvNotReduced,
    NondeterministicDq,
    NanGradRowsWithoutKeys,
    UnwrittenGradRows,
    DkvTileWritePastEnd,
    BackwardKeyExtentFromQuery,
    GradientsAllZero,
    EmptyWorkBackwardError,
    ValueDimNarrowedInDq,
)
from .inputs import (  # noqa: F401  (re-exported: --backend conformance.mutants:<ClassName>)
    Int64OffsetsReadAsInt32,
    StridedOffsetsReadContiguous,
    TokenStrideAssumedPacked,
    NonContiguousGradOutReadPacked,
    FiniteRunningMaxSentinel,
    RunningMaxResetToZero,
    FixedMaxSubtraction,
    BackwardPaddedKeysOverflow,
)


def _registry(*classes: type[Unmutated]) -> dict[str, type[Unmutated]]:
    return {cls.__name__: cls for cls in classes}


MUTANTS: dict[str, type[Unmutated]] = _registry(
    ZeroLengthCompacted,
    CausalTopLeft,
    NanForMaskedRows,
    KeyPastEnd,
    KeyOffsetsFromQuery,
    LseBase2,
    GqaHeadModulo,
    BroadcastQDqFirstSequence,
    CrossSequenceLeak,
    NondeterministicDq,
    ScaleFromValueDim,
    GqaDvNotReduced,
    UnwrittenTail,
    MaxSeqlenOffByOne,
    Float32AsBfloat16,
    KeyExtentFromMaxSeqlen,
    KeyTailBlockSkipped,
    KeyTailScoredZero,
    DuplicatedExtendKeys,
    ValueTilePastEnd,
    CausalDiagonalFromMaxSeqlen,
    CausalShiftFromFirstSequence,
    GqaPackedRowCausal,
    FiniteMaskSentinel,
    EmptyStateMergeNan,
    LseFromLastSplit,
    HeadDimTruncated16,
    HeadDimFixed64,
    OutHeadMajorLayout,
    LsePaddedLayout,
    LseTokenMajor,
    LseEmptyKvPaddedOffset,
    NanGradRowsWithoutKeys,
    UnwrittenGradRows,
    DkvTileWritePastEnd,
    BackwardKeyExtentFromQuery,
    GradientsAllZero,
    EmptyWorkBackwardError,
    LseGqaDecodeFirstHeadOnly,
    GqaDecodeFastPathOneQueryEach,
    ValueDimNarrowedInDq,
    Int64OffsetsReadAsInt32,
    StridedOffsetsReadContiguous,
    TokenStrideAssumedPacked,
    NonContiguousGradOutReadPacked,
    FiniteRunningMaxSentinel,
    RunningMaxResetToZero,
    FixedMaxSubtraction,
    BackwardPaddedKeysOverflow,
)

PENDING: dict[str, type[Unmutated]] = _registry()


def backend_spec(class_name: str) -> str:
    """The ``--backend`` value that selects a mutant (or the control, ``Unmutated``)."""
    return f"conformance.mutants:{class_name}"

