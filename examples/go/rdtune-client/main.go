// rdtune-client: a Go client of the rdtune node agent, built only from the .proto files.
//
// It reads the node's capabilities, creates a group, gives it half of the cache ways with
// an all-or-nothing Apply, reads one observation, takes one Step (apply, interval and
// observe in one call) and one Step as a message on a Session stream, and shows how an
// error arrives: the standard google.rpc.Status in the grpc-status-details-bin trailer,
// with an ErrorInfo and rdtune's ErrorDetail in its details. Each part prints one line
// "part: facts".
//
// Build: the commands in docs/AGENT.md, "Clients in other languages" (stubs generated
// with protoc into a GOPATH, then go build in GOPATH mode, GO111MODULE=off, as
// tests/proto/test_api.py builds it).
//
// Run against an agent: rdtune-client -addr 127.0.0.1:50051 (or unix:///run/rdtune/agent.sock),
// with -token-file FILE when the agent requires a bearer token.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"os"
	"strings"
	"time"

	protov1 "github.com/golang/protobuf/proto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	rdtunev1 "rdtune/gen/go/rdtune/v1"
)

// codec marshals messages with google.golang.org/protobuf, as grpc-go 1.35 and later do by
// themselves; older grpc-go (Debian bookworm's 1.33) still uses the APIv1 library, which
// cannot read messages that protoc-gen-go 1.20 and later generate.
type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (codec) Unmarshal(data []byte, v interface{}) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (codec) Name() string { return "proto" }

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", step, err)
	os.Exit(1)
}

// errorFacts decodes the google.rpc.Status details of a failed call.
func errorFacts(err error) (codes.Code, *errdetails.ErrorInfo, *rdtunev1.ErrorDetail) {
	st, _ := status.FromError(err)
	info, detail := &errdetails.ErrorInfo{}, &rdtunev1.ErrorDetail{}
	for _, any := range st.Proto().GetDetails() {
		switch any.GetTypeUrl() {
		case "type.googleapis.com/google.rpc.ErrorInfo":
			// genproto's ErrorInfo (Debian's) is an APIv1 message.
			if e := protov1.Unmarshal(any.GetValue(), info); e != nil {
				fail("decode ErrorInfo", e)
			}
		case "type.googleapis.com/rdtune.v1.ErrorDetail":
			if e := proto.Unmarshal(any.GetValue(), detail); e != nil {
				fail("decode ErrorDetail", e)
			}
		}
	}
	return st.Code(), info, detail
}

func main() {
	addr := flag.String("addr", "unix:///run/rdtune/agent.sock", "agent address")
	tokenFile := flag.String("token-file", "", "file holding the agent's bearer token")
	group := flag.String("group", "go-example", "name of the group to create")
	flag.Parse()

	conn, err := grpc.Dial(*addr, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithTimeout(10*time.Second), grpc.WithDefaultCallOptions(grpc.ForceCodec(codec{})))
	if err != nil {
		fail("dial", err)
	}
	defer conn.Close()
	ctx := context.Background()
	if *tokenFile != "" {
		token, err := ioutil.ReadFile(*tokenFile)
		if err != nil {
			fail("token", err)
		}
		bearer := "Bearer " + strings.TrimSpace(string(token))
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", bearer)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	agent := rdtunev1.NewNodeAgentClient(conn)

	caps, err := agent.GetCapabilities(ctx, &rdtunev1.GetCapabilitiesRequest{})
	if err != nil {
		fail("capabilities", err)
	}
	l3 := caps.GetL3()
	fmt.Printf("capabilities: vendor=%s cpus=%d cbm_mask=%#x domains=%v\n",
		caps.GetVendor(), caps.GetNumCpus(), l3.GetCbmMask(), l3.GetDomains())

	spec := &rdtunev1.GroupSpec{Name: *group, Kind: rdtunev1.GroupKind_GROUP_KIND_BATCH}
	if _, err := agent.CreateGroup(ctx, &rdtunev1.CreateGroupRequest{Spec: spec}); err != nil {
		fail("create", err)
	}
	fmt.Printf("create: %s\n", *group)

	// The low half of the ways in every domain (contiguous, as the kernel wants).
	ways := 0
	for m := l3.GetCbmMask(); m != 0; m >>= 1 {
		ways += int(m & 1)
	}
	half := int64(1)<<uint(ways/2) - 1
	perDomain := map[uint32]*rdtunev1.GroupAllocation{}
	for _, d := range l3.GetDomains() {
		perDomain[d] = &rdtunev1.GroupAllocation{L3Mask: proto.Int64(half)}
	}
	plan := &rdtunev1.AllocationPlan{Groups: map[string]*rdtunev1.DomainAllocations{
		*group: {Domains: perDomain},
	}}
	applied, err := agent.Apply(ctx, &rdtunev1.ApplyRequest{Plan: plan})
	if err != nil {
		fail("apply", err)
	}
	held := applied.GetAllocation().GetGroups()[*group].GetDomains()[l3.GetDomains()[0]]
	fmt.Printf("apply: %s l3_mask=%#x\n", *group, held.GetL3Mask())

	obs, err := agent.Observe(ctx, &rdtunev1.ObserveRequest{})
	if err != nil {
		fail("observe", err)
	}
	snap := obs.GetSnapshot()
	_, seen := snap.GetGroups()[*group]
	fmt.Printf("observe: t=%.3f groups=%d has_%s=%t\n", snap.GetTimestamp(), len(snap.GetGroups()), *group, seen)

	// What a controller does every interval, in one round trip: Step applies the plan, lets
	// the interval pass (the node's own time on a simulated node) and observes.
	stepped, err := agent.Step(ctx, &rdtunev1.StepRequest{
		Plan: plan, Interval: durationpb.New(100 * time.Millisecond),
	})
	if err != nil {
		fail("step", err)
	}
	held = stepped.GetAllocation().GetGroups()[*group].GetDomains()[l3.GetDomains()[0]]
	fmt.Printf("step: %s l3_mask=%#x interval=%.3f\n",
		*group, held.GetL3Mask(), stepped.GetSnapshot().GetIntervalS())

	// The same calls as messages on one long-lived Session stream: one answer per request,
	// in order, echoing the request's id.
	session, err := agent.Session(ctx)
	if err != nil {
		fail("session", err)
	}
	call := &rdtunev1.SessionRequest_Step{Step: &rdtunev1.StepRequest{}}
	if err := session.Send(&rdtunev1.SessionRequest{Id: 7, Call: call}); err != nil {
		fail("session", err)
	}
	answer, err := session.Recv()
	if err != nil {
		fail("session", err)
	}
	_ = session.CloseSend()
	_, seen = answer.GetStep().GetSnapshot().GetGroups()[*group]
	fmt.Printf("session: id=%d has_%s=%t\n", answer.GetId(), *group, seen)

	// A non-contiguous mask breaks a kernel rule: the whole plan is refused.
	perDomain[l3.GetDomains()[0]] = &rdtunev1.GroupAllocation{L3Mask: proto.Int64(0b101)}
	_, err = agent.Apply(ctx, &rdtunev1.ApplyRequest{Plan: plan})
	if err == nil {
		fail("bad apply", fmt.Errorf("a non-contiguous mask was accepted"))
	}
	code, info, detail := errorFacts(err)
	fmt.Printf("error: code=%s reason=%s domain=%s class=%s rule=%s\n",
		code, info.GetReason(), info.GetDomain(), detail.GetError(), detail.GetDetails()["rule"])

	if _, err := agent.DeleteGroup(ctx, &rdtunev1.DeleteGroupRequest{Name: *group}); err != nil {
		fail("delete", err)
	}
	fmt.Printf("delete: %s\n", *group)
}
