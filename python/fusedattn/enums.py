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


class QKVLayout(IntEnum):
    BS3HD = 0
    BSHD_BS2HD = 1
    BSHD_BSHD_BSHD = 2
    T3HD = 3
    THD_T2HD = 4
    THD_THD_THD = 5


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
