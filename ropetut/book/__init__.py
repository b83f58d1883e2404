"""The book's own machinery, kept beside the library and not part of its API (the
pages themselves are the repository's ``book/`` and ``chapters/``): ``notebook``
(each chapter's first cells, and library source shown in them), ``ledger`` with
``seed_claims.json`` (the seeds' claims and the verdicts the chapters record),
``provenance`` (the commit and machine a stored result came from, which the benchmarks
and the training study record too) and ``exercises`` (chapters 3 to 5's exercises and
their check). It imports the library as a user would; the library never imports it.
"""
