"""How the selected peers' updates are combined: signed, robust, and each peer's contribution."""
