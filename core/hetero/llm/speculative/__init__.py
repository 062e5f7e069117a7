"""Speculative decoding: a drafter proposes tokens, the target model scores them all in one pass over its cache
(``Llm.verify``) and keeps the longest prefix the acceptance rule allows — greedy output token for token that of
plain decoding, sampled output with the target's distribution. See docs/speculative.md.

* ``drafter.py``: the ``Drafter`` protocol (what a drafter gets and returns);
* ``accept.py``: the acceptance rules; ``loop.py``: the verify loop and its adaptive draft length;
* ``lookahead.py`` and ``draft_model.py``: the drafters that need no training; ``registry.py``: ``--spec`` names.
"""

from .draft_model import DraftModel
from .drafter import Draft, Drafter, Hidden, as_draft
from .lookahead import Lookahead
from .loop import Speculation
from .registry import make_drafter, register, speculation

__all__ = ["Draft", "DraftModel", "Drafter", "Hidden", "Lookahead", "Speculation", "as_draft", "make_drafter",
           "register", "speculation"]
