"""The collective algorithms: families behind one contract (contract.py) and the cost-model choice among them."""
