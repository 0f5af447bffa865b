"""The spectest property suite: what ``pytest --spec-model X`` runs against X."""
