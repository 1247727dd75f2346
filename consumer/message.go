package consumer

import (
	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
)

// toMessage converts a sarama record; the Message shares its byte slices.
func toMessage(cm *sarama.ConsumerMessage) *handler.Message { return newMessage(cm, nil) }

// message is toMessage with header names interned in the worker's cache.
func (w *worker) message(cm *sarama.ConsumerMessage) *handler.Message {
	return newMessage(cm, w.names)
}

// messageAlloc holds a Message and room for its first headers, so that a
// record with few headers costs one allocation.
type messageAlloc struct {
	m  handler.Message
	hs [4]handler.Header
}

// maxNames bounds a worker's cache of header names.
const maxNames = 64

// newMessage converts cm. Header names are looked up in names (when not nil)
// so the common ones ("idempotency-key", idem-*) are not copied per record.
func newMessage(cm *sarama.ConsumerMessage, names map[string]string) *handler.Message {
	a := &messageAlloc{m: handler.Message{
		Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset,
		Key: cm.Key, Value: cm.Value, Timestamp: cm.Timestamp,
		Original: handler.Origin{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, Timestamp: cm.Timestamp},
	}}
	hs := a.hs[:0]
	if len(cm.Headers) > len(a.hs) {
		hs = make([]handler.Header, 0, len(cm.Headers))
	}
	for _, h := range cm.Headers {
		if h == nil {
			continue
		}
		name, ok := names[string(h.Key)] // no allocation for the lookup
		if !ok {
			name = string(h.Key)
			if names != nil && len(names) < maxNames {
				names[name] = name
			}
		}
		hs = append(hs, handler.Header{Key: name, Value: h.Value})
	}
	a.m.Headers = hs
	return &a.m
}
