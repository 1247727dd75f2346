// Package correlation carries a correlation id in a context: the id that
// ties together every message and step one business request causes, across
// services. package outbox reads it when it enqueues an event (and exports
// WithCorrelationID, CorrelationID and the Correlate middleware), package
// saga stores it with a saga and gives it to every step and compensation;
// it is published as the header Header.
package correlation

import "context"

// Header is the record header that carries the correlation id.
const Header = "idem-correlation-id"

type key struct{}

// With returns a copy of ctx carrying id; an empty id leaves ctx as it is.
func With(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, key{}, id)
}

// From returns the correlation id ctx carries, "" when none.
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}
