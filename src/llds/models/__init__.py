"""llds.models"""
