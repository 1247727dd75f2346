// Package console is idem's failure console: a web UI and a JSON API
// (OpenAPI at /api/openapi.yaml) over the failure index that an
// index.Indexer fills from the dead-letter topics. Operators see failures
// grouped by cause, open a record (headers, error, stack, payload with
// masking), and replay, resolve, archive or edit and retry records, release
// parked ordering keys and retry failed outbox rows. Every action is
// audited under the name of the token that made it.
//
// New returns the handler; `idem console` serves it with an indexer. A
// service may mount it on its own mux:
//
//	client, err := sarama.NewClient(brokers, index.ProducerConfig(nil)) // publishes replays
//	if err != nil {
//		log.Fatal(err)
//	}
//	tokens, err := console.LoadTokens("/etc/idem/console-tokens") // ROLE NAME SECRET lines
//	if err != nil {
//		log.Fatal(err)
//	}
//	h, err := console.New(console.Config{Pool: pool, Client: client, Tokens: tokens, BasePath: "/console"})
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.Handle("/console/", http.StripPrefix("/console", h))
//
// Tokens carry a Role: Viewer reads (payloads masked), Operator also acts on
// records chosen one by one and may show a payload unmasked, Admin also
// acts on whole failure groups. The UI logs in with a token and keeps a
// signed session cookie; the API takes it as a bearer token. Every form
// carries a CSRF token, and pages are served with a strict
// Content-Security-Policy. docs/console.md walks through it.
package console
