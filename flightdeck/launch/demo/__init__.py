"""`flightdeck demo`: a small real gloo job with an injected fault, diagnosed live by Flightdeck.

`worker` is one rank of the demo job; `ranks` starts ranks as separate interpreters (also used by
the fault-injection acceptance tests, which start them inside network namespaces).
"""
