package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/IBM/sarama"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/internal/control"
)

// A partition's re-drives (the live controls' header in control.go says
// what a re-drive promises): the worker of its own that reads the window
// again, and its progress rows.

// setRedrive marks re-drive id as running on the partition (0: none).
func (cc *claimCtl) setRedrive(id int64) {
	cc.mu.Lock()
	cc.redrive = id
	cc.quiet = false
	cc.ctl.r.pauses.set(cc.c.tp, pauseRedrive, id != 0)
	cc.broadcast()
	cc.mu.Unlock()
	cc.ctl.kick()
}

// errRedriveEnded stops a re-drive's read: it was cancelled, or ended.
var errRedriveEnded = errors.New("consumer: re-drive ended")

// redrives runs the re-drives of the partition, one at a time, until the
// claim ends.
func (cc *claimCtl) redrives() {
	ctx := cc.c.stopCtx
	for failures := 0; ; {
		if s := cc.ctl.state.Load(); s != nil {
			if rd, _, ok := s.Active(cc.c.tp.topic, cc.c.tp.partition); ok && !cc.ended[rd.ID] {
				if cc.redriveOnce(ctx, rd) {
					failures = 0
				} else if failures++; !sleep(ctx, cc.ctl.r.wait.outage(failures)) {
					return
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-cc.wake:
		}
	}
}

// redriveOnce runs re-drive rd's part of the partition from its progress;
// false: it failed and is to be tried again.
func (cc *claimCtl) redriveOnce(ctx context.Context, rd control.Redrive) bool {
	c, r, t := cc.ctl, cc.ctl.r, cc.c.tp
	part, state, err := control.PartOf(ctx, c.pool, rd.ID, t.partition)
	switch {
	case err != nil:
		cc.c.log.Warn("idem: re-drive: read its progress", "redrive", rd.ID, "err", err)
		return false
	case state != control.Running || part.Done:
		cc.ended[rd.ID] = true
		return true
	}
	cc.setRedrive(rd.ID)
	defer cc.setRedrive(0)
	if !cc.quiesce(ctx) {
		return true
	}
	log := cc.c.log.With("redrive", rd.ID, "epoch", rd.Epoch)
	log.Info("idem: re-driving a window", "from", part.Next, "end", part.End, "started_at", part.Start)
	w := cc.c.redriveClaim(rd.ID, rd.Epoch).newWorker()
	var lim *rate.Limiter
	if rd.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(rd.Rate), 1)
	}
	next, saved, lastSave := part.Next, part.Next, time.Now()
	save := func() error {
		if next == saved {
			return nil
		}
		if r.txn != nil { // the forwards of what was re-driven commit first
			if err := (memberTxn{r}).commit(cc.c.sess); err != nil {
				return err
			}
		}
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if _, err := control.Progress(qctx, c.pool, rd.ID, t.partition, next, c.id); err != nil {
			return err
		}
		saved = next
		return nil
	}
	err = control.ReadWindow(ctx, c.client, t.topic, t.partition, part.Next, part.End, func(m *sarama.ConsumerMessage) error {
		if s := c.state.Load(); s != nil && !s.Running(rd.ID) {
			return errRedriveEnded
		}
		if !cc.unpaused(ctx) {
			return errStopping
		}
		if lim != nil && lim.Wait(ctx) != nil {
			return errStopping
		}
		if err := w.handle(m); err != nil {
			return err
		}
		next = m.Offset + 1
		if time.Since(lastSave) >= progressEvery {
			lastSave = time.Now()
			if err := save(); err != nil {
				log.Warn("idem: re-drive: progress not recorded; trying again in a second", "next", next, "err", err)
			}
		}
		return nil
	})
	if err == nil {
		next = part.End
	}
	serr := save()
	switch {
	case err == nil && serr == nil:
		log.Info("idem: re-drive of the partition done", "end", part.End)
		cc.ended[rd.ID] = true
		return true
	case errors.Is(err, errRedriveEnded):
		log.Info("idem: re-drive cancelled; stopped", "next", next)
		cc.ended[rd.ID] = true
		return true
	case ctx.Err() != nil || errors.Is(err, errStopping):
		return true // the claim ends: the partition's next owner goes on
	}
	log.Warn("idem: re-drive failed; trying again from its progress", "next", saved, "err", errors.Join(err, serr))
	return false
}

// redriveClaim is a claim of the partition for a re-drive's worker: the
// partition's session, contexts and metrics, no tracker (a record's
// outcome moves the re-drive's progress, never the group's offset: redo)
// and no stall watch.
func (c *claim) redriveClaim(id, epoch int64) *claim {
	return &claim{r: c.r, sess: c.sess, kc: c.kc, tp: c.tp, log: c.log.With("redrive", id, "epoch", epoch), debug: c.debug,
		tier: c.tier, mxs: c.mxs, obs: c.obs, stopCtx: c.stopCtx, stop: c.stop, hctx: c.hctx, hcancel: c.hcancel, ctl: c.ctl, redo: true, owner: c.owner}
}
