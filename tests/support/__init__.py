"""Helpers shared by the test modules: clusters of real processes, fakes, builders and fixtures. No test lives here,
and nothing here imports a test module (tests/test_tests_layout.py).
"""
