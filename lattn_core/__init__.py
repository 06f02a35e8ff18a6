"""NumPy references for *A Brief Executable History of Linear Attention*.

One head, the article's notation ("convention B"): ``Q, K`` are ``(n, d_k)``, ``V`` is ``(n, d_v)``,
the state ``S`` is ``(d_v, d_k)``, a read is ``o_t = S_t q_t``, a write adds ``v_t k_t^T``. Causal
always, no implicit ``1/sqrt(d)``, float64 in and out. See the book's notation page.

Modules, in the order of the book: ``_validate`` (the one input-validation helper), ``checks``
(state an identity and check it), ``masks``, ``rnn`` (chapter 0), ``softmax`` (chapter 1),
``linear_attention`` (chapter 2), ``forget_gates`` (chapter 3), ``ttt`` (chapter 4), ``delta``
(chapters 5-6), ``feeding_back`` (chapters 7-8), ``path`` (chapter 9), ``mesanet`` (chapter 10),
``short_convolution`` (chapter 11). ``lattn_core.notebook`` (notebook conveniences) is
imported on its own. The package imports nothing from :mod:`kernels`; the experiments that train
torch models live in :mod:`experiments`.
"""
__distribution__ = "linear-attention-history"  # only this book's packages say so (lattn_core.distribution)
from . import (_validate, checks, delta, feeding_back, forget_gates, linear_attention, masks, mesanet, path,
               rnn, short_convolution, softmax, ttt)
from ._validate import *  # noqa: F401,F403
from .checks import *  # noqa: F401,F403
from .masks import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .softmax import *  # noqa: F401,F403
from .linear_attention import *  # noqa: F401,F403
from .forget_gates import *  # noqa: F401,F403
from .ttt import *  # noqa: F401,F403
from .delta import *  # noqa: F401,F403
from .feeding_back import *  # noqa: F401,F403
from .path import *  # noqa: F401,F403
from .mesanet import *  # noqa: F401,F403
from .short_convolution import *  # noqa: F401,F403

__all__ = [name for module in (_validate, checks, masks, rnn, softmax, linear_attention, forget_gates,
                               ttt, delta, feeding_back, path, mesanet, short_convolution)
           for name in module.__all__]
