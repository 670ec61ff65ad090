package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"
	"go.opentelemetry.io/otel"

	"github.com/warden-go/warden/guard"
)

// Wrap returns a robfig/cron JobWrapper that runs a job only while holding
// the lock name on g, for programs that keep their own cron.Cron. A run
// that finds the lock held is skipped (or waits, with WaitForLock); the lock
// is kept for LockAtLeastFor; a panic is recovered and the lock released.
// Outcomes go to slog.Default and the otel global providers.
//
// A cron.Job takes no context, so neither a lost lock nor LockAtMostFor can
// stop it, and robfig/cron names no slot, so there is no once-per-slot
// claim: for those, use a Scheduler.
func Wrap(g *guard.Guard, name string, opts ...JobOption) cron.JobWrapper {
	jc := jobConfig{atMost: time.Hour}
	for _, o := range opts {
		if o != nil {
			o(&jc)
		}
	}
	lockOpts := []guard.LockOption{guard.NoWait()}
	if jc.wait > 0 {
		lockOpts = []guard.LockOption{guard.WaitAtMost(jc.wait)}
	}
	if jc.ttl > 0 {
		lockOpts = append(lockOpts, guard.TTL(jc.ttl))
	}
	logger := slog.Default()
	// The global providers' instruments cannot fail to be created; if a
	// custom global one does, runs are still guarded, only not measured.
	tel, telErr := newTelemetry(otel.GetTracerProvider(), otel.GetMeterProvider())
	return func(inner cron.Job) cron.Job {
		return cron.FuncJob(func() {
			rec := RunRecord{Job: name, Started: time.Now()}
			rec.Slot = rec.Started
			ctx := context.Background()
			finish := func(o Outcome, reason string, err error) {
				rec.Finished, rec.Outcome, rec.Reason, rec.Err = time.Now(), o, reason, err
				if telErr == nil {
					_, span := tel.start(ctx, &rec)
					tel.end(ctx, span, &rec)
				}
				level := slog.LevelWarn
				switch o {
				case Ran:
					level = slog.LevelDebug
				case Skipped:
					level = slog.LevelInfo
				}
				logger.Log(ctx, level, "warden/scheduler: wrapped job "+string(o), "job", name, "token", rec.Token, "reason", reason, "error", err)
			}
			l, err := g.Lock(ctx, name, lockOpts...)
			if err != nil {
				if errors.Is(err, guard.ErrNotAcquired) {
					finish(Skipped, "lock held", nil)
				} else {
					finish(Failed, "lock", err)
				}
				return
			}
			rec.Token = l.Token()
			locked := time.Now()
			defer func() {
				if wait := jc.atLeast - time.Since(locked); wait > 0 && l.Err() == nil {
					time.Sleep(wait) // the hold LockAtLeastFor asks for; robfig runs each job on its own goroutine
				}
				l.Unlock(ctx)
			}()
			err = func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("%w: %v", ErrPanicked, r)
					}
				}()
				inner.Run()
				return nil
			}()
			switch {
			case errors.Is(l.Err(), guard.ErrLockLost):
				finish(Lost, "", l.Err())
			case err != nil:
				finish(Failed, "", err)
			default:
				finish(Ran, "", nil)
			}
		})
	}
}

// Locker makes g serve as a go-co-op/gocron/v2 Locker
// (gocron.WithDistributedLocker): gocron asks it for the job's name before
// each run and skips the run when the lock is held. The lock is kept until
// atLeast has passed since it was taken, even when the job ends sooner, so
// that a scheduler whose timer fires a little later finds it held; gocron's
// Unlock returns at once and the lock is released in the background then.
//
// gocron does not hand the lock's context to the job, so a lost lock cannot
// cancel it; gocron names no slot either. For those, use a Scheduler.
func Locker(g *guard.Guard, atLeast time.Duration, opts ...guard.LockOption) gocron.Locker {
	return gocronLocker{g: g, atLeast: atLeast, opts: opts}
}

type gocronLocker struct {
	g       *guard.Guard
	atLeast time.Duration
	opts    []guard.LockOption
}

func (l gocronLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	lk, err := l.g.TryLock(ctx, key, l.opts...)
	if err != nil {
		return nil, err
	}
	return heldAtLeast{l: lk, until: time.Now().Add(l.atLeast)}, nil
}

// heldAtLeast is a gocron.Lock whose release waits for its LockAtLeastFor.
type heldAtLeast struct {
	l     *guard.Lock
	until time.Time
}

func (h heldAtLeast) Unlock(ctx context.Context) error {
	wait := time.Until(h.until)
	if wait <= 0 {
		return h.l.Unlock(ctx)
	}
	// Detached: gocron's context ends with the run, the hold does not.
	ctx = context.WithoutCancel(ctx)
	time.AfterFunc(wait, func() { h.l.Unlock(ctx) })
	return nil
}
