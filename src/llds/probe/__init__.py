"""Measurements that run the model beyond the training pass: the one-step probe (the paper's
Eq. 3) and fixed reference chains."""
