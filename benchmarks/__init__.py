"""Benchmarks (not timed tests): see README.md here. A package so the type checker sees them as one."""
