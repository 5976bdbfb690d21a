"""The enums of the fused attention API.

Their integer values are the C++ engine's (csrc/fusedattn/attention/params.h); the test
suite checks the two agree.
"""

from enum import IntEnum


class AttnBiasType(IntEnum):
    NO_BIAS = 0
    PRE_SCALE_BIAS = 1
    POST_SCALE_BIAS = 2


class AttnMaskType(IntEnum):
    NO_MASK = 0
    PADDING_MASK = 1
    CAUSAL_MASK = 2
    PADDING_CAUSAL_MASK = 3
    CAUSAL_BOTTOM_RIGHT_MASK = 4
    PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5

    def is_padding(self) -> bool:
        return self in (AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
                        AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)

    def is_causal(self) -> bool:
        return self not in (AttnMaskType.NO_MASK, AttnMaskType.PADDING_MASK)

    def is_bottom_right(self) -> bool:
        return self in (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
                        AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)


class QKVFormat(IntEnum):
    """TransformerEngine's memory formats of a layout (QKVLayout.get_qkv_format()); SBHD is
    TE's [S, B, H, D], which no fusedattn layout uses."""
    SBHD = 0
    BSHD = 1
    THD = 2


class QKVLayout(IntEnum):
    BS3HD = 0
    BSHD_BS2HD = 1
    BSHD_BSHD_BSHD = 2
    T3HD = 3
    THD_T2HD = 4
    THD_THD_THD = 5

    # TransformerEngine's queries of a layout.
    def is_qkvpacked(self) -> bool:
        """One qkv tensor [B, S, 3, H, D]."""
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self) -> bool:
        """q and one kv tensor [B, S, 2, H, D]."""
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self) -> bool:
        """Three tensors q, k, v."""
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def is_thd(self) -> bool:
        """Several sequences packed per row (max_segments_per_seq)."""
        return self in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)

    def get_qkv_format(self) -> QKVFormat:
        return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD


class SoftmaxType(IntEnum):
    VANILLA_SOFTMAX = 0
    OFF_BY_ONE_SOFTMAX = 1
    LEARNABLE_SOFTMAX = 2


class SoftmaxFusionType(IntEnum):
    """The fused softmax of fusedattn.softmax(): which elements a row keeps.

    SCALED keeps every element; SCALED_MASKED keeps those where the mask is False
    (True = masked out); SCALED_UPPER_TRIANG_MASKED keeps j <= i (causal). The
    lower-case names ("scaled", "scaled_masked", "scaled_upper_triang_masked") are
    accepted wherever a SoftmaxFusionType is.
    """

    SCALED = 0
    SCALED_MASKED = 1
    SCALED_UPPER_TRIANG_MASKED = 2
