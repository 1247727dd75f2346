package handler

// RetryAfterError is the error RetryAfter returns, for the external tests.
type RetryAfterError = retryAfterError

// DeferError is the error DeferUntil and Defer return, for the external tests.
type DeferError = deferError
