package outbox

// SetAfterAck installs a hook the relay calls after a round's acks and before
// it deletes the acked rows (the crash test stops the process there).
func SetAfterAck(r *Relay, f func(ids []int64)) { r.afterAck = f }
