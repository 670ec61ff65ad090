package etcdlock

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

var _ driver.Pinger = (*Locker)(nil)

// Ping implements driver.Pinger. The read goes to the pinned member and,
// when that member is found not answering, starts over on the member
// pinned next, as an acquisition does: Ping fails when the cluster does
// not answer, not when one listed member is down.
func (l *Locker) Ping(ctx context.Context) error {
	for moved := 0; ; moved++ {
		err := l.members.do(ctx, l.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
			_, err := c.Get(rctx, pingKey, clientv3.WithCountOnly())
			return err
		})
		if !movesOn(ctx, err, moved) {
			return answered(err)
		}
	}
}

// Ping reports whether the store's etcd cluster answers, as Locker.Ping
// does.
func (s *Store) Ping(ctx context.Context) error { return ping(ctx, s.client, s.timeout) }

// pingKey is read, never written: a linearizable read of any key needs the
// cluster's leader and a quorum, which is what locks need too.
const pingKey = "\x00warden-ping"

func ping(ctx context.Context, c *clientv3.Client, b bound) error {
	rctx, cancel := b.ctx(ctx)
	defer cancel()
	_, err := c.Get(rctx, pingKey, clientv3.WithCountOnly())
	return answered(b.err(ctx, rctx, err))
}

// answered is the outcome of a ping whose read failed with err: nil when
// etcd refused the read for want of rights. etcd checks them once the
// linearizable read is agreed (by a leader and a quorum), so the refusal
// answers what the ping asks; and with authentication on, the users of a
// Locker or a Store have rights on their own keys, not on pingKey.
func answered(err error) error {
	if denied(err) {
		return nil
	}
	return err
}
