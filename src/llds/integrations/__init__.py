"""llds.integrations"""
