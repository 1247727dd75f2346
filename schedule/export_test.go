package schedule

// SetAfterAck sets the test hook that runs after a round's acks and before
// its rows are deleted.
func SetAfterAck(s *Scheduler, f func(ids []int64)) { s.afterAck = f }
