"""llds.env"""
