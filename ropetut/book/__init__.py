"""The book's own machinery, kept beside the library and not part of its API (the
pages themselves are the repository's ``book/`` and ``chapters/``): ``notebook``
(each chapter's first cells, and library source shown in them), ``report`` (tables
sized for the book's column: HTML in a notebook, text elsewhere), ``ledger`` with
``seed_claims.json`` (the seeds' claims and the verdicts the chapters record),
``provenance`` (the commit and machine a stored result came from, which the benchmarks
and the training study record too) and ``exercises`` (the twelve exercises of chapters 1
to 8, their solutions and their check). It imports the library as a user would; the
library never imports it.
"""
