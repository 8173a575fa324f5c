"""Full-batch graph training, shaped like pytorch/examples' ``gat/main.py`` and ``gcn/main.py``:
the whole graph (node features, an adjacency matrix, labels, a train/val/test split of the
nodes) is built once; every epoch is one step that trains on the same tensors, the loss taken
over the training nodes only, then evaluates on the validation nodes (``model.eval()``). No
loader, no per-step batch. The graph is synthetic (the examples download Cora), of the same
dtypes and layouts:

- ``--model gat``: multi-head graph attention over a dense adjacency with self-loops; scores of
  missing edges masked to -9e16 before the softmax (large, finite: not a failure);
- ``--model gcn``: two graph convolutions over the renormalised adjacency
  ``D^-1/2 (A + I) D^-1/2`` and row-normalised features, both **sparse** (``to_sparse()``,
  ``torch.spmm``), as gcn/main.py keeps them.

Wired for replay as a user would add it to ``train_iter``: the Recorder is made once before the
epochs; the optimisation part of ``train_iter`` becomes a step function handed over with
``replay.step(...)``, evaluation and logging stay outside it. ``--graph closure`` (default):
the step closes over the graph and takes the epoch number as its batch (gat/main.py run so).
``--graph batch``: the graph itself, ``(features, adj)``, is the step's batch (gcn/main.py run
so): a sparse batch must replay sparse.

Before its Recorder the program writes ``train.log`` (opened with ``"w"``, a line per epoch)
and ``init.pt`` (``torch.save`` of the initial weights): a replay must leave both as they are.

The planted failure: the learning rate, set by the loop through ``ExponentialLR``, grows by
``--lr-growth`` each epoch (a scheduler's gamma typed as 10 instead of 0.1). The weights grow
until float32 overflows in the forward: in gat, ``aten::bmm`` of the attention scores (the line
marked ``# scores``) at step 16, and the loss is NaN; in gcn, the loss's mean over the training
nodes (``aten::nll_loss_forward``) at step 22, and the loss is +inf. ``--lr-growth 1`` trains
healthily.

    python full_batch_graph.py [--model gat|gcn] [--graph closure|batch] [--epochs 30]
                               [--lr-growth 10]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

N_NODES, N_FEATURES, N_CLASSES, N_EDGES = 400, 24, 4, 1200


class GraphAttentionLayer(nn.Module):
    def __init__(self, in_features, out_features, n_heads, dropout=0.4):
        super().__init__()
        self.n_heads, self.n_hidden, self.dropout = n_heads, out_features, dropout
        self.W = nn.Parameter(torch.empty(in_features, out_features * n_heads))
        self.a = nn.Parameter(torch.empty(n_heads, 2 * out_features, 1))
        nn.init.xavier_normal_(self.W)
        nn.init.xavier_normal_(self.a)
        self.leakyrelu = nn.LeakyReLU(0.2)

    def forward(self, h, adj_mat):
        n_nodes = h.shape[0]
        h = F.dropout(torch.mm(h, self.W), self.dropout, training=self.training)
        h = h.view(n_nodes, self.n_heads, self.n_hidden).permute(1, 0, 2)
        source = torch.matmul(h, self.a[:, : self.n_hidden, :])  # scores
        target = torch.matmul(h, self.a[:, self.n_hidden :, :])
        e = self.leakyrelu(source + target.mT)
        e = torch.where(adj_mat > 0, e, -9e16 * torch.ones_like(e))  # missing edges
        attention = F.dropout(F.softmax(e, dim=-1), self.dropout, training=self.training)
        return torch.matmul(attention, h).mean(dim=0)


class GAT(nn.Module):
    def __init__(self, in_features, n_hidden, n_heads, num_classes):
        super().__init__()
        self.gat1 = GraphAttentionLayer(in_features, n_hidden, n_heads)
        self.gat2 = GraphAttentionLayer(n_hidden, num_classes, 1)

    def forward(self, x, adj_mat):
        return F.log_softmax(self.gat2(F.elu(self.gat1(x, adj_mat)), adj_mat), dim=1)


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = nn.Parameter(torch.zeros(output_dim))

    def forward(self, x, adj_mat):
        support = torch.mm(x, self.kernel)
        return torch.spmm(adj_mat, support) + self.bias


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim):
        super().__init__()
        self.gc1, self.gc2 = GraphConv(input_dim, hidden_dim), GraphConv(hidden_dim, output_dim)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x, adj_mat):
        x = self.dropout(F.relu(self.gc1(x, adj_mat)))
        return F.log_softmax(self.gc2(x, adj_mat), dim=1)


def load_graph(model):
    """A Cora-like graph: sparse binary bag-of-words features, random citations, labels."""
    g = torch.Generator().manual_seed(0)
    features = (torch.rand(N_NODES, N_FEATURES, generator=g) < 0.2).float()
    features[:, 0] = 1.0  # no empty row
    features = features / features.sum(1, keepdim=True)
    labels = torch.randint(0, N_CLASSES, (N_NODES,), generator=g)
    edges = torch.randint(0, N_NODES, (2, N_EDGES), generator=g)
    adj = torch.zeros(N_NODES, N_NODES)
    adj[edges[0], edges[1]] = 1.0
    adj = ((adj + adj.T) > 0).float() + torch.eye(N_NODES)
    if model == "gat":
        return features, adj, labels
    d = adj.sum(1).rsqrt()
    adj = d[:, None] * adj * d[None, :]
    return features.to_sparse(), adj.to_sparse(), labels


def evaluate(model, criterion, graph, labels, mask):
    model.eval()
    with torch.no_grad():
        out = model(*graph)[mask]
        return criterion(out, labels[mask]).item(), (
            out.argmax(1) == labels[mask]
        ).float().mean().item()


def train_iter(epoch, model, optimizer, criterion, graph, labels, idx_train, idx_val, how, log):
    def step(batch):  # the optimisation part of upstream's train_iter
        model.train()
        optimizer.zero_grad()
        output = model(*(graph if how == "closure" else batch))
        loss = criterion(output[idx_train], labels[idx_train])
        loss.backward()
        optimizer.step()
        return loss

    loss = replay.step(epoch if how == "closure" else graph, step)
    loss_val, acc_val = evaluate(model, criterion, graph, labels, idx_val)
    print(f"epoch {epoch} loss {loss.item():.6g} val {loss_val:.4f} acc {acc_val:.3f}", file=log,
          flush=True)  # fmt: skip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["gat", "gcn"], default="gat")
    p.add_argument("--graph", choices=["closure", "batch"], default="closure")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--lr-growth", type=float, default=10.0)
    args = p.parse_args()

    torch.manual_seed(13)
    features, adj, labels = load_graph(args.model)
    idx = torch.randperm(N_NODES)
    idx_test, idx_val, idx_train = idx[:100], idx[100:150], idx[150:]
    if args.model == "gat":
        model = GAT(N_FEATURES, 8, 4, N_CLASSES)
    else:
        model = GCN(N_FEATURES, 16, N_CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=args.lr_growth)
    criterion = nn.NLLLoss()
    log = open("train.log", "w")  # noqa: SIM115 - the run's log, open for the whole run
    print(f"{args.model}: {N_NODES} nodes, {N_FEATURES} features", file=log, flush=True)
    torch.save(model.state_dict(), "init.pt")

    replay.Recorder("run.h5", objects={"model": model, "optimizer": optimizer,
                                       "scheduler": scheduler}, snapshot_every=10)  # fmt: skip
    for epoch in range(args.epochs):
        train_iter(epoch, model, optimizer, criterion, (features, adj), labels, idx_train,
                   idx_val, args.graph, log)  # fmt: skip
        scheduler.step()
    print("test loss {:.4f} acc {:.3f}".format(*evaluate(model, criterion, (features, adj),
                                                           labels, idx_test)), file=log)  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)
