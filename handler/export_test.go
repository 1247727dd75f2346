package handler

// RetryAfterError is the error RetryAfter returns, for the external tests.
type RetryAfterError = retryAfterError
