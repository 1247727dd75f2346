package checkpoint

// Metrics returns r's collectors.
func Metrics[R any](r *Runner[R]) *collectors { return r.m }
