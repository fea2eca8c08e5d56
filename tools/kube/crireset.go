package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runCRIReset is `kube cri-reset unix:///path/to/containerd.sock`: it stops and removes every
// pod sandbox of that container runtime, with their containers, as a node's teardown must
// (stopping a sandbox gives its address back to the CNI plugin and removes its network
// namespace; the runtime's own stop would leave them behind).
func runCRIReset() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kube cri-reset unix:///path/to/runtime.sock")
		os.Exit(2)
	}
	if err := resetSandboxes(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "cri-reset:", err)
		os.Exit(1)
	}
}

func resetSandboxes(endpoint string) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	listed, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing the pod sandboxes: %w", err)
	}
	for _, sandbox := range listed.Items {
		id := &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.Id}
		if _, err := client.StopPodSandbox(ctx, id); err != nil {
			return fmt.Errorf("stopping %s: %w", sandbox.Metadata.GetName(), err)
		}
		remove := &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}
		if _, err := client.RemovePodSandbox(ctx, remove); err != nil {
			return fmt.Errorf("removing %s: %w", sandbox.Metadata.GetName(), err)
		}
	}
	fmt.Printf("removed %d pod sandboxes\n", len(listed.Items))
	return nil
}
