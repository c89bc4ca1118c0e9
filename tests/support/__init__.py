"""Helpers of the test suite and the benchmarks (no tests here): each is imported as
`tests.support.<module>`, the one name it has. docs/dev/testing.md lists what each module holds."""
