"""chess"""
