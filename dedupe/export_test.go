package dedupe

// SweeperWithDefaults exposes Sweeper.withDefaults to the external tests.
func SweeperWithDefaults(s Sweeper) Sweeper { return s.withDefaults() }

// DefaultLeaseForTest is the lease NewPostgresLease takes when given 0.
const DefaultLeaseForTest = defaultLease

// DefaultTable is the inbox table used when WithTable is not given.
const DefaultTable = defaultTable

// The unexported errors, for the external tests.
var (
	ErrNoTx      = errNoTx
	ErrLeaseLost = errLeaseLost
	ErrTxAborted = errTxAborted
)
