"""llds.train"""
