"""The training study of chapter 9, kept beside the library and not part of its API:
``model`` (``TinyGPT``, which takes each RoPE of the library), ``data`` (the Jargon
File corpus in ``corpus/``, its tokens and splits), ``train`` (one run or a named
study, ``python -m ropetut train``), ``checkpoint`` (a run paused and resumed) and
``stats`` (paired statistics over seeds). It imports the library as a user would;
the library never imports it.
"""
