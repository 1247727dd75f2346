package schedule

import "github.com/idemhq/idem/dedupe"

// SetAfterAck sets the test hook that runs after a round's acks and before
// its rows are deleted.
func SetAfterAck(s *Scheduler, f func(ids []int64)) { s.afterAck = f }

// Beginner is dedupe.DB, the handle type Migrate takes, for the external tests.
type Beginner = dedupe.DB
