package txn

import "github.com/IBM/sarama"

// TxnStatus returns the producer's transaction status, for the tests; 0 when
// a fatal error dropped the producer.
func (o *Owner) TxnStatus() sarama.ProducerTxnStatusFlag {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.prod == nil {
		return 0
	}
	return o.prod.TxnStatus()
}
