"""The collective algorithms: families behind one contract (contract.py), and the choice among
them (choice.py).

Every family takes flat contiguous arrays and element offsets and works in place; the layer
above (execution) handles shapes, dtypes, scaling and copies.
"""
