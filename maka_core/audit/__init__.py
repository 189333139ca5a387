"""``maka audit``: the ledger's lineage against every Temporal execution that hosted it (pure)."""
