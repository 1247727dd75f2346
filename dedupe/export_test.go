package dedupe

// SweeperWithDefaults exposes Sweeper.withDefaults to the external tests.
func SweeperWithDefaults(s Sweeper) Sweeper { return s.withDefaults() }
