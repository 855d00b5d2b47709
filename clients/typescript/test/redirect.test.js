// Redirects: the client never carries a credential, a fencing token, a scope or a body to
// another origin. Two real HTTP servers on loopback (two ports: two origins), no fencegate.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { Client } from 'fencegate';

function listen(handler) {
  return new Promise((resolve) => {
    const server = createServer(handler);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

const origin = (server) => `http://127.0.0.1:${server.address().port}`;

test('a redirect to another origin is not followed: nothing reaches it', async () => {
  const seen = [];
  const elsewhere = await listen((req, res) => {
    seen.push({ url: req.url, headers: req.headers });
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
  const redirecting = await listen((req, res) => {
    res.writeHead(Number(req.url.split('status=')[1] ?? 307) || 307, { location: `${origin(elsewhere)}${req.url}` }).end();
  });
  try {
    const client = new Client({ url: origin(redirecting), apiKey: 'secret-key' });
    await assert.rejects(client.put('k', { v: 1 }, { token: '5', scope: 'billing' }), /not followed/);
    await assert.rejects(client.request('GET', '/v1/kv/k?status=302'), /not followed/);
    await assert.rejects(client.request('GET', '/v1/kv/k?status=308'), /not followed/);
    assert.deepEqual(seen, [], 'the other origin got no request (no token, scope, key or body)');
  } finally {
    elsewhere.close();
    redirecting.close();
  }
});

test('a 307 to the same origin is followed, with its method and body', async () => {
  const seen = [];
  const server = await listen((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, body, token: req.headers['x-fencing-token'] });
      if (req.url === '/v1/kv/old') {
        res.writeHead(307, { location: '/v1/kv/new' }).end();
      } else {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"key":"new"}');
      }
    });
  });
  try {
    const client = new Client({ url: origin(server) });
    assert.deepEqual(await client.put('old', { v: 1 }, { token: '7' }), { key: 'new' });
    assert.deepEqual(
      seen.map((r) => [r.method, r.url, r.body, r.token]),
      [
        ['PUT', '/v1/kv/old', '{"v":1}', '7'],
        ['PUT', '/v1/kv/new', '{"v":1}', '7'],
      ],
    );
  } finally {
    server.close();
  }
});
