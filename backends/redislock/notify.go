package redislock

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// notifier shares one Pub/Sub connection, and one subscription per lock key,
// among all the Locker's waiters. A release message wakes one local waiter
// (or, in fair mode, the waiter it names), never all of them: the others keep
// sleeping, so a process does not stampede the server after every release.
type notifier struct {
	client goredis.UniversalClient

	closed chan struct{} // closed by close

	mu       sync.Mutex
	ps       *goredis.PubSub // nil while nobody waits
	subs     map[string]*subscription
	isClosed bool
}

// subscription is the process's interest in one channel.
type subscription struct {
	channel string
	ps      *goredis.PubSub // the connection it was made on
	refs    int
	ready   chan struct{} // closed once the server confirmed it
	isReady bool
	// any holds at most one wake-up for whichever non-fair waiter takes it.
	any chan struct{}
	// named has one wake-up channel per fair waiter, by its id.
	named map[string]chan struct{}
	// linger drops the subscription a while after its last waiter left.
	linger *time.Timer
}

// lingerFor keeps a subscription nobody waits on for a while, so that a key
// contended again and again is not subscribed anew (a round trip, and a
// connection when it was the only one) for every wait.
const lingerFor = 2 * time.Second

func newNotifier(client goredis.UniversalClient) *notifier {
	return &notifier{client: client, closed: make(chan struct{}), subs: make(map[string]*subscription)}
}

// close ends the Pub/Sub connection and every wait on it.
func (n *notifier) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.isClosed {
		return nil
	}
	n.isClosed = true
	close(n.closed)
	for _, s := range n.subs {
		if s.linger != nil {
			s.linger.Stop()
		}
	}
	clear(n.subs)
	if n.ps == nil {
		return nil
	}
	err := n.ps.Close()
	n.ps = nil
	return err
}

// joinIfActive registers a waiter on a subscription that is already live, at
// no cost, or returns nil. Joining before the first attempt means that no
// release after that attempt can go unnoticed. The channel returned is the
// one the waiter sleeps on; others reports whether local waiters were
// already there.
func (n *notifier) joinIfActive(channel, id string) (s *subscription, wake <-chan struct{}, others bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s = n.subs[channel]
	if s == nil || !s.isReady {
		return nil, nil, false
	}
	others = s.refs > 0
	return s, n.register(s, id), others
}

// join registers a waiter, subscribing to channel if this process is not yet
// subscribed, and returns once the server confirmed the subscription (or ctx
// ends; a waiter whose confirmation is slow still has its PTTL fallback).
func (n *notifier) join(ctx context.Context, channel, id string) (*subscription, <-chan struct{}, error) {
	n.mu.Lock()
	if n.isClosed {
		n.mu.Unlock()
		return nil, nil, errClosed
	}
	s := n.subs[channel]
	if s == nil {
		s = &subscription{
			channel: channel,
			ready:   make(chan struct{}),
			any:     make(chan struct{}, 1),
			named:   make(map[string]chan struct{}),
		}
		// A write on the Pub/Sub connection is short and bounded by the
		// client's write timeout; holding mu across it keeps SUBSCRIBE and
		// UNSUBSCRIBE of one channel in the order they were decided.
		wctx := context.WithoutCancel(ctx)
		if n.ps == nil {
			n.ps = n.client.Subscribe(wctx, channel)
			go n.receive(n.ps, n.ps.ChannelWithSubscriptions())
		} else if err := n.ps.Subscribe(wctx, channel); err != nil {
			// go-redis resubscribes after reconnecting, so a failed write
			// is not final; the PTTL fallback covers the gap.
			_ = err
		}
		s.ps = n.ps
		n.subs[channel] = s
	}
	wake := n.register(s, id)
	n.mu.Unlock()

	select {
	case <-s.ready:
		return s, wake, nil
	case <-ctx.Done():
		n.leave(s, id, false)
		return nil, nil, ctx.Err()
	case <-n.closed:
		return nil, nil, errClosed
	}
}

// register counts a waiter in and returns the channel it sleeps on: its own
// for a fair waiter (id != ""), the shared one otherwise.
func (n *notifier) register(s *subscription, id string) <-chan struct{} {
	if s.refs == 0 && s.linger != nil {
		s.linger.Stop()
		s.linger = nil
		// A release nobody was waiting for: the newcomer tries first anyway.
		select {
		case <-s.any:
		default:
		}
	}
	s.refs++
	if id == "" {
		return s.any
	}
	c := make(chan struct{}, 1)
	s.named[id] = c
	return c
}

// leave unregisters a waiter. passOn hands a wake-up the waiter consumed but
// did not use to the next local waiter, so that a waiter that gives up right
// after being woken cannot strand the others.
func (n *notifier) leave(s *subscription, id string, passOn bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id != "" {
		delete(s.named, id)
	}
	if passOn {
		select {
		case s.any <- struct{}{}:
		default:
		}
	}
	s.refs--
	if s.refs > 0 || n.isClosed {
		return
	}
	s.linger = time.AfterFunc(lingerFor, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if s.refs == 0 && n.subs[s.channel] == s {
			n.drop(s)
		}
	})
}

// drop ends a subscription nobody waits on, and the connection with the last.
func (n *notifier) drop(s *subscription) {
	delete(n.subs, s.channel)
	if s.ps != n.ps {
		return // its connection is already gone
	}
	if len(n.subs) == 0 {
		n.ps.Close()
		n.ps = nil
		return
	}
	_ = n.ps.Unsubscribe(context.Background(), s.channel)
}

// receive dispatches the messages of one Pub/Sub connection until it closes.
func (n *notifier) receive(ps *goredis.PubSub, ch <-chan any) {
	for m := range ch {
		switch m := m.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				n.confirmed(ps, m.Channel)
			}
		case *goredis.Message:
			n.deliver(ps, m.Channel, m.Payload)
		}
	}
}

func (n *notifier) confirmed(ps *goredis.PubSub, channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.subs[channel]; s != nil && s.ps == ps && !s.isReady {
		s.isReady = true
		close(s.ready)
	}
}

// deliver wakes the fair waiter the message names, if it waits here, and one
// non-fair waiter.
func (n *notifier) deliver(ps *goredis.PubSub, channel, next string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.subs[channel]
	if s == nil || s.ps != ps {
		return
	}
	// A message that names a waiter wakes that waiter only, in the one
	// process where it waits: the others go on sleeping, which is what
	// keeps a release from costing an attempt per process.
	if next != "" {
		if c := s.named[next]; c != nil {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		return
	}
	select {
	case s.any <- struct{}{}:
	default:
	}
}
