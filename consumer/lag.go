package consumer

import (
	"context"
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// watchLag refreshes idem_consumer_lag of every claimed partition (source
// and retry-tier topics) every LagInterval, and at once when a partition is
// claimed (so a series exists from the start), until ctx is done: the partition's
// high watermark minus the group's committed offset, both asked of the
// cluster, so the figure is what an outside tool (kafka-consumer-groups)
// shows. Series of partitions no longer claimed are removed.
func (cs *claimSet) watchLag(ctx context.Context, client sarama.Client, interval time.Duration) {
	if interval < 0 {
		return
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		cs.log.Warn("idem: consumer lag disabled: admin client", "err", err)
		return
	}
	// Closing the admin would close the shared client; it holds no other resource.
	t := time.NewTicker(interval)
	defer t.Stop()
	shown := map[tp]bool{}
	for {
		cs.refreshLag(ctx, client, admin, shown)
		select {
		case <-ctx.Done():
			for k := range shown {
				cs.m.ConsumerLag.DeleteLabelValues(cs.group, k.topic, strconv.Itoa(int(k.partition)))
			}
			return
		case <-t.C:
		case <-cs.kick:
		}
	}
}

// refreshLag sets the lag of the partitions claimed now and removes the
// series in shown that are not claimed any more.
func (cs *claimSet) refreshLag(ctx context.Context, client sarama.Client, admin sarama.ClusterAdmin, shown map[tp]bool) {
	claimed := map[string][]int32{}
	parts := map[tp]*claim{}
	cs.parts.Range(func(k, v any) bool {
		t := k.(tp)
		claimed[t.topic] = append(claimed[t.topic], t.partition)
		parts[t] = v.(*claim)
		return true
	})
	for k := range shown {
		if parts[k] == nil {
			cs.m.ConsumerLag.DeleteLabelValues(cs.group, k.topic, strconv.Itoa(int(k.partition)))
			delete(shown, k)
		}
	}
	if len(parts) == 0 || ctx.Err() != nil {
		return
	}
	resp, err := admin.ListConsumerGroupOffsets(cs.group, claimed)
	if err != nil {
		cs.log.Debug("idem: consumer lag: committed offsets", "err", err)
		return
	}
	for k, p := range parts {
		if ctx.Err() != nil {
			return
		}
		hwm, err := client.GetOffset(k.topic, k.partition, sarama.OffsetNewest)
		if err != nil {
			cs.log.Debug("idem: consumer lag: high watermark", "topic", k.topic, "partition", k.partition, "err", err)
			continue
		}
		committed := int64(-1)
		if b := resp.GetBlock(k.topic, k.partition); b != nil && b.Err == sarama.ErrNoError {
			committed = b.Offset
		}
		if committed < 0 { // nothing committed yet: where the claim started
			committed = p.kc.InitialOffset()
			if committed == sarama.OffsetOldest {
				if committed, err = client.GetOffset(k.topic, k.partition, sarama.OffsetOldest); err != nil {
					continue
				}
			}
		}
		if committed < 0 { // started at the newest offset: no figure until a commit
			continue
		}
		if _, ok := cs.parts.Load(k); !ok {
			continue // revoked meanwhile
		}
		cs.m.ConsumerLag.WithLabelValues(cs.group, k.topic, strconv.Itoa(int(k.partition))).Set(float64(max(hwm-committed, 0)))
		shown[k] = true
	}
}
