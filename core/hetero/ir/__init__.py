"""Graph passes (the graph IR itself is part of the backend contract: ``hetero.contract.graph``)."""
