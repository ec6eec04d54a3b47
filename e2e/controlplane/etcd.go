package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd starts a single-member etcd on loopback with the data directory and
// client/peer URLs given, and serves until SIGTERM/SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dataDir := fs.String("data-dir", "", "data directory")
	clientURL := fs.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peerURL := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	quotaBytes := fs.Int64("quota-backend-bytes", 2<<30, "backend quota")
	_ = fs.Parse(args)
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-client-urls: %v\n", err)
		return 2
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-peer-urls: %v\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = "tender-e2e"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.QuotaBackendBytes = *quotaBytes
	cfg.LogLevel = "error"
	// Tests are throwaway: favour start-up speed and low disk I/O over durability.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()
	<-e.Server.ReadyNotify()
	fmt.Fprintf(os.Stderr, "etcd: ready on %s\n", cu.String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
