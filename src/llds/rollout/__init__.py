"""llds.rollout"""
