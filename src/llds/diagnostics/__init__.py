"""llds.diagnostics"""
