"""llds.algo"""
