package scheduler_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

func Example() {
	// In production every node has its own client of a shared backend and
	// slot store (Redis, SQL, etcd); here both are in-process.
	g, err := guard.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	s, err := scheduler.New(g,
		scheduler.WithSlotStore(idempotency.NewMemoryStore()),
		scheduler.WithInstance("node-1"),
		scheduler.WithRunObserver(func(r scheduler.RunRecord) {
			// Record runs in your own database here.
			_ = r.Outcome
		}))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	err = s.Add("@every 1s", "close-orders", func(ctx context.Context) error {
		run, _ := scheduler.RunFrom(ctx)
		// Pass run.Lock.Token() to the storage the job writes (fencing), and
		// honour ctx: it is cancelled if the lock is lost.
		fmt.Println("closing orders on", run.Instance, "with a fencing token:", run.Lock.Token() > 0)
		close(done)
		return nil
	}, scheduler.LockAtMostFor(time.Minute), scheduler.LockAtLeastFor(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: closing orders on node-1 with a fencing token: true
}

// A program that keeps its own robfig/cron runs its jobs through the
// Scheduler's run path with WrapSpec, given the job's spec: slot claim,
// lock, bounds, telemetry.
func ExampleScheduler_WrapSpec() {
	g, err := guard.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	s, err := scheduler.New(g, scheduler.WithSlotStore(idempotency.NewMemoryStore()))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(context.Background())
	const spec = "0 6 * * *"
	wrap, err := s.WrapSpec(spec, "send-reports", scheduler.LockAtMostFor(10*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New()
	if _, err := c.AddJob(spec, cron.NewChain(wrap).Then(cron.FuncJob(func() {
		// send the reports
	}))); err != nil {
		log.Fatal(err)
	}
	c.Start()
	defer c.Stop()
}

// A go-co-op/gocron/v2 program runs its jobs under warden's locks with the
// Scheduler's Locker.
func ExampleScheduler_Locker() {
	g, err := guard.New(memory.New())
	if err != nil {
		log.Fatal(err)
	}
	s, err := scheduler.New(g, scheduler.WithSlotStore(idempotency.NewMemoryStore()))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(context.Background())
	locker, err := s.Locker(scheduler.LockAtMostFor(10 * time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	gs, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := gs.NewJob(gocron.CronJob("0 6 * * *", false), gocron.NewTask(func() {
		// send the reports
	}), gocron.WithName("send-reports")); err != nil {
		log.Fatal(err)
	}
	gs.Start()
	defer gs.Shutdown()
}
