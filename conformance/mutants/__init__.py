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

from . import backward, forward, inputs
from .base import Unmutated


def _registry(*classes: type[Unmutated]) -> dict[str, type[Unmutated]]:
    return {cls.__name__: cls for cls in classes}


MUTANTS: dict[str, type[Unmutated]] = _registry(
    forward.ZeroLengthCompacted,
    forward.CausalTopLeft,
    forward.CausalOffsetWrapsUnsigned,
    forward.NanForMaskedRows,
    forward.KeyPastEnd,
    forward.KeyOffsetsFromQuery,
    forward.LseBase2,
    forward.GqaHeadModulo,
    backward.BroadcastQDqFirstSequence,
    forward.CrossSequenceLeak,
    backward.NondeterministicDq,
    forward.ScaleFromValueDim,
    forward.ScaleKeyedOnShapes,
    forward.OffsetsPlanKeyedOnIdentity,
    backward.GqaDvNotReduced,
    forward.UnwrittenTail,
    forward.MaxSeqlenOffByOne,
    forward.Float32AsBfloat16,
    forward.KeyExtentFromMaxSeqlen,
    forward.KeyTailBlockSkipped,
    forward.KeyTailScoredZero,
    forward.DuplicatedExtendKeys,
    forward.ValueTilePastEnd,
    forward.CausalDiagonalFromMaxSeqlen,
    forward.CausalShiftFromFirstSequence,
    forward.GqaPackedRowCausal,
    forward.FiniteMaskSentinel,
    forward.EmptyStateMergeNan,
    forward.LseFromLastSplit,
    forward.HeadDimTruncated16,
    forward.HeadDimFixed64,
    forward.OutHeadMajorLayout,
    forward.LsePaddedLayout,
    forward.LseTokenMajor,
    forward.LseEmptyKvPaddedOffset,
    backward.NanGradRowsWithoutKeys,
    backward.UnwrittenGradRows,
    backward.DqRowsPastHeadDim,
    backward.DkvTileWritePastEnd,
    backward.BackwardKeyExtentFromQuery,
    backward.GradientsAllZero,
    backward.EmptyWorkBackwardError,
    forward.LseGqaDecodeFirstHeadOnly,
    forward.GqaDecodeFastPathOneQueryEach,
    backward.ValueDimNarrowedInDq,
    inputs.Int64OffsetsReadAsInt32,
    inputs.StridedOffsetsReadContiguous,
    inputs.TokenStrideAssumedPacked,
    inputs.MisalignedBaseRoundedDown,
    inputs.NonContiguousGradOutReadPacked,
    inputs.FiniteRunningMaxSentinel,
    inputs.RunningMaxResetToZero,
    inputs.FixedMaxSubtraction,
    inputs.BackwardPaddedKeysOverflow,
    forward.QueryRowsFromBatchIndex,
    forward.LsePositiveInfWithoutKeys,
    backward.BackwardCausalTopLeft,
    backward.GqaDkvHeadMapInterleaved,
)

PENDING: dict[str, type[Unmutated]] = _registry()
# every mutant is an attribute of this package: --backend conformance.mutants:<ClassName>
globals().update(MUTANTS)


def backend_spec(class_name: str) -> str:
    """The ``--backend`` value that selects a mutant (or the control, ``Unmutated``)."""
    return f"conformance.mutants:{class_name}"

