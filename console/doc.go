// Package console is idem's failure console: a web UI and a JSON API
// (OpenAPI at /api/openapi.yaml) over the failure index that an
// index.Indexer fills from the dead-letter topics. Operators see failures
// grouped by cause, open a record (headers, error, stack, payload with
// masking), and replay, resolve, archive or edit and retry records, release
// parked ordering keys and retry failed outbox rows. Every action is
// audited under the name of the token that made it.
//
// New returns the console, an http.Handler; `idem console` serves it with
// an indexer. A service may mount it on its own mux:
//
//	pcfg := sarama.NewConfig()
//	retrytopic.ConfigureProducer(pcfg) // publishes replays: idempotent, acks=all, no topic auto-creation
//	client, err := sarama.NewClient(brokers, pcfg)
//	if err != nil {
//		log.Fatal(err)
//	}
//	tokens, err := console.LoadTokens("/etc/idem/console-tokens") // ROLE NAME SECRET lines
//	if err != nil {
//		log.Fatal(err)
//	}
//	c, err := console.New(console.Config{Pool: pool, Client: client, Tokens: tokens, BasePath: "/console"})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer c.Close() // hands unfinished replay jobs back to the next console
//	http.Handle("/console/", http.StripPrefix("/console", c))
//
// Tokens carry a Role: Viewer reads (payloads masked), Operator also acts on
// records chosen one by one (up to Config.MaxOperatorRecords a request) and
// may show a payload unmasked (a POST, audited), Admin also acts on a
// failure group's row and on filters. A replay goes to a record's origin
// topic or its group's retry tiers only (Config.ReplayTopics lists more).
// Replays and edits claim their records before they publish and run as
// jobs of the Console, which outlive their requests and are resumed by the
// next console when one stops. The UI logs in with a token and keeps a
// session cookie, revoked on logout; the API takes the token as a bearer
// token. Logins and bad tokens are rate-limited per address, every form
// carries a CSRF token, and pages are served with a strict
// Content-Security-Policy. docs/console.md walks through it, and its
// "Security model" says what each role may touch.
package console
