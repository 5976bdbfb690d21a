"""fusedattn: fused attention for JAX, with a C++/CUDA engine behind XLA FFI."""

from . import _lib
from .context_parallel import (CPStrategy, ReorderStrategy, inverse_reorder_causal_load_balancing,
                               reorder_causal_load_balancing)
from .attention import fused_attn
from .determinism import deterministic, is_deterministic, set_deterministic
from .backends import BackendInfo, get_backend, is_fused_attn_kernel_available
from .dot_product import dot_product_attention, install, installed, is_installed, uninstall
from .enums import AttnBiasType, AttnMaskType, QKVFormat, QKVLayout, SoftmaxFusionType, SoftmaxType
from .reference import attention_reference
from .sequence import SequenceDescriptor, make_swa_mask
from .small_seq import SmallSeqDescriptor, fused_attn_small_seq
from .softmax import is_softmax_kernel_available, softmax, softmax_fallback

AttnSoftmaxType = SoftmaxType  # TransformerEngine's name of the same enum

__version__ = _lib.version()
set_num_threads = _lib.set_num_threads
num_threads = _lib.num_threads

__all__ = [
    "AttnBiasType", "AttnMaskType", "AttnSoftmaxType", "BackendInfo", "CPStrategy", "QKVFormat", "QKVLayout", "ReorderStrategy", "SequenceDescriptor",
    "SmallSeqDescriptor", "SoftmaxFusionType", "SoftmaxType", "attention_reference",
    "deterministic", "dot_product_attention", "fused_attn", "fused_attn_small_seq", "get_backend",
    "install", "installed", "is_deterministic", "inverse_reorder_causal_load_balancing", "is_installed", "reorder_causal_load_balancing",
    "is_fused_attn_kernel_available", "is_softmax_kernel_available", "make_swa_mask", "num_threads",
    "set_deterministic", "set_num_threads", "softmax", "softmax_fallback", "uninstall",
]
