package consumer

import (
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// warnRetention compares the inbox's retention (Config.Retention.Keep, or
// its default when Run sweeps) with each source topic's
// retention.ms and warns when the inbox forgets keys sooner than Kafka keeps
// records: a group that re-reads old records (its committed offsets expired,
// or an operator reset them) would apply those records a second time. It only
// logs; a topic whose config cannot be read is skipped with a DEBUG line.
func (s setup) warnRetention(client sarama.Client) {
	inbox := inboxRetention(s.cfg)
	if inbox <= 0 {
		return
	}
	for topic, d := range s.retentions(client, s.cfg.Topics) {
		if d >= 0 && d <= inbox {
			continue
		}
		kafka := "for ever (retention.ms=-1)"
		if d >= 0 {
			kafka = d.String()
		}
		s.log.Warn("idem: the inbox forgets keys sooner than Kafka keeps records; a record re-read after its key was swept (expired group offsets, an offset reset) is applied twice",
			"topic", topic, "topic_retention", kafka, "inbox_retention", inbox,
			"fix", "keep inbox keys at least as long as the topic's retention.ms, or set StartAt: StartNewest")
	}
}

// retentions returns the retention.ms of topics (negative: for ever); a
// topic whose config cannot be read is left out, with a DEBUG line.
func (s setup) retentions(client sarama.Client, topics []string) map[string]time.Duration {
	out := map[string]time.Duration{}
	if len(topics) == 0 {
		return out
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		s.log.Debug("idem: retention check skipped", "err", err)
		return out
	}
	// Closing the admin would close the shared client; it holds no other resource.
	resources := make([]*sarama.ConfigResource, len(topics))
	for i, t := range topics {
		resources[i] = &sarama.ConfigResource{Type: sarama.TopicResource, Name: t, ConfigNames: []string{"retention.ms"}}
	}
	results, err := admin.DescribeConfigs(resources, sarama.DescribeConfigsOptions{})
	if err != nil {
		s.log.Debug("idem: retention check skipped", "err", err)
		return out
	}
	for _, res := range results {
		if res.ErrorCode != sarama.ErrNoError {
			s.log.Debug("idem: retention check skipped", "topic", res.Name, "err", res.ErrorCode)
			continue
		}
		for _, e := range res.Configs {
			if e.Name != "retention.ms" {
				continue
			}
			if ms, err := strconv.ParseInt(e.Value, 10, 64); err == nil {
				out[res.Name] = time.Duration(ms) * time.Millisecond
			}
		}
	}
	return out
}

// warnIgnoredInitial logs a WARN when Config.Sarama asks for
// Consumer.Offsets.Initial = OffsetOldest (sarama's default is OffsetNewest,
// so it was set on purpose) while StartAt is StartNewest: StartAt decides,
// and the override must not be silent.
func (s setup) warnIgnoredInitial() {
	if s.cfg.Sarama.Consumer.Offsets.Initial == sarama.OffsetOldest && s.cfg.StartAt == StartNewest {
		s.log.Warn("idem: Config.Sarama.Consumer.Offsets.Initial is OffsetOldest but StartAt is StartNewest; idem uses StartAt",
			"fix", "set StartAt: consumer.StartOldest, or leave Offsets.Initial alone")
	}
}
