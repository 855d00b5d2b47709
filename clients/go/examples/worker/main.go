// A worker that adopts fencing: it takes the built-in lock "nightly", writes under it, and stops
// the moment the lease is lost. Run it against a fencegate:
//
//	FENCEGATE_URL=http://127.0.0.1:8080 go run ./examples/worker
package main

import (
	"context"
	"errors"
	"log"
	"os"
	"time"

	fencegate "github.com/fencegate/fencegate/clients/go"
)

func main() {
	c, err := fencegate.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Lease(ctx, "nightly", fencegate.LeaseOptions{TTL: 10 * time.Second, Owner: "worker-1", Wait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
	for i := 0; i < 3; i++ {
		_, err := l.Put(ctx, "invoice-7", map[string]any{"total": 120, "step": i}) // token and scope sent for you
		var stale *fencegate.StaleTokenError
		if errors.As(err, &stale) {
			log.Printf("a newer holder exists (our token %s, the fence %s): stopping", stale.Presented, stale.Current)
			os.Exit(3)
		} else if err != nil {
			log.Fatal(err)
		}
		select {
		case <-l.Lost():
			log.Fatalf("lease lost: %v", l.Err())
		case <-time.After(time.Second):
		}
	}
	log.Printf("done under token %s", l.Token())
}
