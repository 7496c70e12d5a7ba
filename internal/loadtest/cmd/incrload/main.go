// Command incrload is the Redis floor of a fixed-window decision: callers
// send a bare pipelined INCRBY key 1 and PEXPIRE key (the window) on keys
// drawn at random from a key space, through the rueidis client that
// redisstore.New builds for the same URL (the same connection, pipelining
// and flush settings sluice uses). internal/loadtest/bench-envoy-cold.sh
// reads redis-server's CPU over a run and divides it by the pairs sent. It
// is a benchmark tool: nothing imports it, and only that script builds it.
//
//	incrload -url redis://127.0.0.1:6379/0 -c 64 -d 10s -keys 100000
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/redisstore"
)

func main() {
	url := flag.String("url", "redis://127.0.0.1:6379/0", "Redis URL, as sluice's store.url")
	conc := flag.Int("c", 64, "callers (pairs in flight)")
	dur := flag.Duration("d", 10*time.Second, "duration")
	keys := flag.Int("keys", 100000, "distinct keys")
	prefix := flag.String("prefix", "rls:{edge}:fw:60:remote_address=10.0.", "key prefix; a key number follows")
	ttl := flag.Duration("ttl", time.Minute, "PEXPIRE of every key")
	lua := flag.Bool("lua", false, "send each pair as one EVALSHA of a script running INCRBY and PEXPIRE")
	fw := flag.Bool("sluice", false, "send, instead of each pair, one EVALSHA of the script sluice runs for a fixed window of 100/min (redisstore.Script)")
	rate := flag.Float64("rate", 0, "pairs per second in all, spaced evenly; 0 sends as fast as the callers can")
	flag.Parse()
	if err := run(*url, *conc, *dur, *keys, *prefix, *ttl, *lua, *fw, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "incrload:", err)
		os.Exit(1)
	}
}

// pairScript is INCRBY and PEXPIRE in one script call.
const pairScript = `local c = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return c`

func run(url string, conc int, dur time.Duration, keys int, prefix string, ttl time.Duration, lua, fw bool, rate float64) error {
	if conc < 1 || keys < 1 || dur <= 0 || rate < 0 {
		return fmt.Errorf("want -c, -keys and -d above zero and -rate not negative")
	}
	ctx := context.Background()
	st, err := redisstore.New(ctx, redisstore.Options{URL: url})
	if err != nil {
		return err
	}
	defer st.Close()
	client := st.Client()
	if client == nil {
		return fmt.Errorf("redis %s not reachable", url)
	}
	pttl := ttl.Milliseconds()
	script := rueidis.NewLuaScript(pairScript)
	args := []string{"1", strconv.FormatInt(pttl, 10)}
	if fw {
		src, argv, err := redisstore.Script(sluice.Request{Key: "k", Algorithm: sluice.FixedWindow,
			Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Cost: 1})
		if err != nil {
			return err
		}
		script, args, lua = rueidis.NewLuaScript(src), argv, true
	}
	runCtx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var pairs, errs, sent atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			buf := make([]byte, 0, len(prefix)+12)
			for runCtx.Err() == nil {
				if rate > 0 { // the i-th pair leaves at start + i/rate
					at := start.Add(time.Duration(float64(sent.Add(1)) / rate * float64(time.Second)))
					if d := time.Until(at); d > 0 {
						select {
						case <-time.After(d):
						case <-runCtx.Done():
							return
						}
					}
				}
				buf = strconv.AppendInt(append(buf[:0], prefix...), int64(rand.IntN(keys)), 10)
				k := string(buf)
				if lua {
					if err := script.Exec(ctx, client, []string{k}, args).Error(); err != nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, &err)
						continue
					}
					pairs.Add(1)
					continue
				}
				rs := client.DoMulti(ctx,
					client.B().Incrby().Key(k).Increment(1).Build(),
					client.B().Pexpire().Key(k).Milliseconds(pttl).Build())
				if err := rs[0].Error(); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				if err := rs[1].Error(); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				pairs.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("pairs      %d in %s (%d errors)\n", pairs.Load(), el.Round(time.Millisecond), errs.Load())
	if e := firstErr.Load(); e != nil {
		fmt.Printf("first error %v\n", *e)
	}
	fmt.Printf("throughput %.0f pairs/s\n", float64(pairs.Load())/el.Seconds())
	return nil
}
